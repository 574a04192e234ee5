"""Real count tables for the utility benchmark, each read from a package installed offline.

* "words" (Zipf-like): wordfreq's English "small" list (pip package wordfreq; 28,917 words),
  each frequency times 10^6 (a corpus of a million tokens), rounded: counts 1 to 53,703.
* "unicode" (heavy, tied head): the assigned code points of each Unicode block (block ranges
  from fontTools.unicodedata.Blocks, the pip package fonttools; assignment from Python's
  unicodedata): 2 private-use blocks tied at the top (65,534), large CJK blocks, then runs of
  full blocks tied at 256, 128, 96 ...
* "senses" (a long tail of zeros): every word sense of WordNet 3.0 (Debian package
  wordnet-base, /usr/share/wordnet: the senses each lemma has in index.noun, .verb, .adj,
  .adv) with its SemCor tag count from cntlist.rev; senses never tagged count 0 (most of them).

Each loader returns the counts in descending order (ids are ranks) and refuses, in words, when
its package is missing. Nothing is downloaded.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

WORDNET = Path("/usr/share/wordnet")
WORDNET_POS = {"noun": "n", "verb": "v", "adj": "a", "adv": "r"}
SENSE_KEY_POS = {"1": "n", "2": "v", "3": "a", "4": "r", "5": "a"}  # 5: satellite adjective
DATASETS = ("words", "unicode", "senses")
SHAPES = {
    "words": "Zipf-like (wordfreq English, per 10^6 tokens)",
    "unicode": "heavy tied head (assigned code points per Unicode block)",
    "senses": "long tail of zeros (WordNet 3.0 senses, SemCor tag counts)",
}


class MissingData(RuntimeError):
    """A data set's package is not installed."""


def words() -> np.ndarray:
    try:
        import wordfreq
    except ImportError:
        raise MissingData("the words data set needs the pip package wordfreq") from None
    frequencies = np.array(list(wordfreq.get_frequency_dict("en", wordlist="small").values()))
    return np.sort(np.round(frequencies * 1e6))[::-1]


def unicode_blocks() -> np.ndarray:
    import unicodedata

    try:
        from fontTools.unicodedata import Blocks
    except ImportError:
        raise MissingData("the unicode data set needs the pip package fonttools") from None
    starts = [*Blocks.RANGES, 0x110000]
    counts = [
        sum(unicodedata.category(chr(c)) != "Cn" for c in range(starts[i], starts[i + 1]))
        for i, name in enumerate(Blocks.VALUES)
        if name != "No_Block"
    ]
    return np.sort(np.array(counts, dtype=np.float64))[::-1]


def senses() -> np.ndarray:
    if not (WORDNET / "cntlist.rev").exists():
        raise MissingData(
            "the senses data set needs the Debian package wordnet-base (/usr/share/wordnet)"
        )
    tagged: dict[tuple[str, str, int], int] = {}
    for line in (WORDNET / "cntlist.rev").read_text().splitlines():
        key, number, count = line.split()
        lemma, _, rest = key.partition("%")
        tagged[(lemma, SENSE_KEY_POS[rest[0]], int(number))] = int(count)
    counts: list[int] = []
    for name, pos in WORDNET_POS.items():
        for line in (WORDNET / f"index.{name}").read_text().splitlines():
            if line.startswith(" "):  # the license header
                continue
            fields = line.split()
            lemma, senses_of = fields[0], int(fields[2])
            counts.extend(tagged.get((lemma, pos, n), 0) for n in range(1, senses_of + 1))
    return np.sort(np.array(counts, dtype=np.float64))[::-1]


def load(name: str) -> np.ndarray:
    """The counts of a data set (DATASETS), descending."""
    loaders = {"words": words, "unicode": unicode_blocks, "senses": senses}
    if name not in loaders:
        raise ValueError(f"unknown data set {name!r}; expected one of {DATASETS}")
    return loaders[name]()
