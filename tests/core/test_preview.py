"""preview(): its predicted figures against measured releases, what it reads, what it refuses.

The predictions are simulations of each mechanism's law on the table's score histogram
(topk_middleware/preview.py); here they are checked against 200 real releases of the mechanism
itself (fixed seeds) on an ArraySource: precision@k within 0.05, median k-relative error within
10% (or both zero). A wrong calibration (a scale off by 2x) or a wrong tail law (Binomial
counts of the items above tau) moves precision by more than 0.05 on these tables. Cost: about
3 s, and the one-shot simulation's own law against 8,000 full draws (seconds).
"""

from __future__ import annotations

import numpy as np
import pytest

from adapters.memory import ArraySource
from topk_middleware import limited_domain_top_k, preview, private_top_k
from topk_middleware.preview import (
    NOTICE,
    ScoreHistogram,
    limited_domain_item_epsilon,
    release_figures,
    simulate_one_shot,
)

TRIALS = 200


def zero_tail_scores(m: int = 6000) -> np.ndarray:
    """A Zipf head of 150 items over a tail of zeros (the shape where the default struggles)."""
    head = np.floor(400.0 / np.arange(1, 151) ** 0.7)
    return np.concatenate([head, np.zeros(m - len(head))])


def measured(scores: np.ndarray, k: int, release) -> tuple[float, float]:
    kth = float(np.sort(scores)[::-1][k - 1])
    values = np.full((TRIALS, k), np.nan)
    for trial in range(TRIALS):
        items = release(trial)
        values[trial, : len(items)] = scores[np.asarray(items, dtype=np.int64)]
    precision, error, _ = release_figures(values, kth, 0.01 * kth, k)
    return float(precision.mean()), float(np.median(error))


def close(predicted: float, observed: float) -> bool:
    return abs(predicted - observed) <= 0.1 * observed + 1e-9


@pytest.mark.parametrize("epsilon", [0.5, 2.0])
def test_preview_matches_measured_releases(epsilon: float) -> None:
    scores = zero_tail_scores()
    source = ArraySource(scores)
    k, delta = 10, 1e-6
    found = preview(
        source,
        k,
        epsilons=[epsilon],
        methods=["threshold", "laplace", "limited_domain"],
        delta=delta,
    )
    threshold = measured(
        scores, k, lambda s: private_top_k(source, k, epsilon, delta=delta, seed=s).items
    )
    laplace = measured(
        scores,
        k,
        lambda s: private_top_k(source, k, epsilon, delta=delta, noise="laplace", seed=s).items,
    )
    limited = found.outcome("limited_domain", epsilon)
    item = limited_domain_item_epsilon(k, epsilon, delta / 2)
    limited_measured = measured(
        scores,
        k,
        lambda s: (
            limited_domain_top_k(
                source, k, limited.k_bar, item, delta / 2, delta_prime=delta / 2, seed=s
            ).items
        ),
    )
    for method, (precision, error) in (
        ("threshold", threshold),
        ("laplace", laplace),
        ("limited_domain", limited_measured),
    ):
        got = found.outcome(method, epsilon)
        assert abs(got.precision - precision) <= 0.05, (method, got, precision)
        assert close(got.median_error, error), (method, got, error)


@pytest.mark.parametrize("noise", ["gumbel", "laplace"])
def test_one_shot_simulation_draws_the_one_shot_law(noise: str) -> None:
    """simulate_one_shot against the definition of the one-shot law (the top k of every count
    plus its own noise, 8,000 draws with all m noises), on five counts 12..8, 300 tied at 6 and
    1,695 zeros, k = 3, scale 5: runs beyond the head where hundreds of items pass tau (the
    order-statistics draw of their k largest noises). The released set's make-up (how many of
    the five, of the 6s, of the zeros) agrees by a chi-square test of homogeneity, p > 0.001;
    a noise scale 15% off fails it."""
    from scipy import stats

    from topk_middleware.noise import make_noise

    scores = np.concatenate([[12.0, 11, 10, 9, 8], np.full(300, 6.0), np.zeros(1695)])
    hist = ScoreHistogram(
        np.array([12.0, 11, 10, 9, 8, 6, 0]), np.array([1, 1, 1, 1, 1, 300, 1695])
    )
    k, scale, draws = 3, 5.0, 8_000

    def make_up(values: np.ndarray) -> np.ndarray:
        kinds = (values >= 8).sum(axis=1) * 16 + (values == 6).sum(axis=1) * 4
        return np.bincount(kinds + (values == 0).sum(axis=1), minlength=64)

    rng = np.random.default_rng(11)
    law = make_noise(noise, scale)
    exact = np.empty((draws, k))
    for lo in range(0, draws, 2000):
        noisy = scores + law.sample(rng, (2000, len(scores)))
        exact[lo : lo + 2000] = scores[np.argpartition(-noisy, k - 1, axis=1)[:, :k]]
    for factor, agrees in ((1.0, True), (1.15, False)):
        simulated = simulate_one_shot(hist, k, noise, factor * scale, draws, rng)
        table = np.array([make_up(exact), make_up(simulated)])
        table = table[:, table.sum(axis=0) > 0]
        p_value = stats.chi2_contingency(table)[1]
        assert (p_value > 1e-3) == agrees, (noise, factor, p_value)


def test_preview_reads_the_histogram_only_and_says_what_it_is() -> None:
    scores = zero_tail_scores()
    found = preview(ArraySource(scores), 10, epsilons=[1.0], methods=["threshold"])
    runs = len(np.unique(scores))
    assert found.accesses.rows_fetched == runs  # one row per distinct score, not m = 6000
    assert found.accesses.sorted == 0 and found.accesses.random == 0
    assert found.histogram_runs == runs and found.m == len(scores)
    assert str(found).startswith(NOTICE) and "not a private release" in NOTICE
    assert found.as_dict()["notice"] == NOTICE


def test_preview_warns_where_the_tail_outruns_the_noise() -> None:
    # k = 100 on a head of 150 (100th count 376) over 60,000 zeros at epsilon 0.5: the largest
    # tail noise of the default (Gumbel, scale 54 at delta 1e-6: about 54 ln 60000 = 600) passes
    # the 100th count; at epsilon 1 (scale 28) it does not
    scores = np.concatenate([np.floor(1500.0 / np.arange(1, 151) ** 0.3), np.zeros(60_000)])
    found = preview(ArraySource(scores), 100, epsilons=[0.5, 1.0], trials=100)
    noisy, quiet = found.outcome("threshold", 0.5), found.outcome("threshold", 1.0)
    assert noisy.tail_items >= 0.5 and quiet.tail_items < 0.5
    (warning,) = [line for line in found.recommendations if line.startswith("warning")]
    assert "epsilon 0.5" in warning and "near-zero items" in warning
    assert "raise epsilon to 1 " in warning and quiet.precision >= noisy.precision


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"k": 0}, "k must be >= 1"),
        ({"epsilons": [0.0]}, "epsilon must be finite and > 0"),
        ({"epsilons": []}, "at least one epsilon"),
        ({"methods": ["oneshot_sql"]}, "methods must be among"),
        ({"trials": 0}, "trials must be a positive integer"),
        ({"k": 7000}, "k"),
    ],
)
def test_preview_refuses_bad_input_before_reading(kwargs: dict, message: str) -> None:
    source = ArraySource(zero_tail_scores())
    arguments = {"k": 10, **kwargs}
    with pytest.raises((ValueError, TypeError), match=message):
        preview(source, **arguments)


def test_cli_preview_on_a_duckdb_table(tmp_path, capsys) -> None:
    import duckdb

    from frontends.cli import main

    scores = zero_tail_scores(2000).astype(np.int64)
    path = tmp_path / "votes.duckdb"
    with duckdb.connect(str(path)) as con:
        con.execute("CREATE TABLE votes (item BIGINT, votes BIGINT)")
        con.executemany("INSERT INTO votes VALUES (?, ?)", list(enumerate(scores.tolist())))
    table = [str(path), "--table", "votes", "--id", "item", "--score", "votes"]
    assert main(["preview", *table, "--k", "10", "--epsilons", "1", "--trials", "50"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == NOTICE
    assert "threshold" in out and "limited_domain" in out
    code = main(
        [
            "preview",
            *table,
            "--k",
            "10",
            "--epsilons",
            "0.5",
            "2",
            "--methods",
            "threshold",
            "--trials",
            "50",
            "--json",
        ]
    )
    assert code == 0
    import json

    found = json.loads(capsys.readouterr().out)
    assert found["notice"] == NOTICE and found["m"] == len(scores)
    assert [row["epsilon"] for row in found["outcomes"]] == [0.5, 2.0]
    assert main(["preview", *table, "--k", "0"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "topk-middleware preview: error: k must be >= 1, got 0"


def test_preview_is_not_part_of_the_sql_functions() -> None:
    """The SQL functions analysts call never reach the preview: neither the installer, the
    PL/Python store nor install.sql names it (the installed schema is checked in
    tests/frontends/test_sql_function.py)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "frontends"
    package = sorted(p.relative_to(root) for p in (root / "sql").glob("*.py"))
    assert len(package) > 5  # the package's modules, each read below
    for name in ("sql_function.py", "plpython.py", "duckdb_sql.py", "sql/install.sql", *package):
        assert "preview" not in (root / name).read_text().lower(), name
