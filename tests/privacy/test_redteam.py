"""The red team's distinguishers (benchmarks/redteam.py), small: each attack's accuracy over 10
paired trials after 3 training observations of each table, on the real PostgreSQL, in a
database of the benchmark's own.

Threshold. Where the defence holds, what the attacker sees does not depend on the table, so
its guesses are right with probability 1/2 each and the number right of 10 is Binomial(10,
1/2): P(all 10 right) = 1/1024. The defended attacks must get at most 9 of 10 right (a false
failure 0.1% of the time at worst; where the observations are equal, the ties are broken by a
seeded coin, so the count is the same on every run). Power: the controls (the cancel attack
with the hidden window's helpers in their PL/pgSQL forms, and pg_statio on a table whose
neighbour's last vote split a page of the score index, read by a role that may not set
track_counts on a table that accepts the channel: the residue docs/promise.md states) must get
at least 9 right (a coin does with P = 11/1024). Their observations differ by a fixed number of
blocks; at 100 trials they got every one right, at 10 trials now and then 9 (a missed trial
whose cause is not pinned down: a late flush of the statistics is the likely one). Without
that acceptance the same role's oblivious releases are refused before anything is read, and
the observer sees nothing of them. The 100-trial figures are in docs/promise.md.
Cost: 70 s at a load average of 11 (one installation, seven tables, eight measurements of
26 observations; the cancel attack's statements take 0.35 s each, cancelled for 0.15 s).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from benchmarks import redteam
from benchmarks.redteam_lab import Lab, split_pair, updated_pair

pytestmark = [
    pytest.mark.xdist_group("redteam"),
    pytest.mark.filterwarnings("ignore:.*may not set track_counts:UserWarning"),
]

TRIALS, TRAIN, DEFENDED_MOST, CONTROL_LEAST = 10, 3, 9, 9


@pytest.fixture(scope="module")
def lab(pg_conninfo: str) -> Iterator[Lab]:
    made = Lab(pg_conninfo)
    yield made
    made.close()


@pytest.fixture(scope="module")
def updated(lab: Lab) -> tuple[str, str]:
    return updated_pair(lab)


@pytest.fixture(scope="module")
def split(lab: Lab) -> Callable[[str], tuple[str, str]]:
    """split_pair(lab, mode), made once per mode."""
    return functools.cache(lambda mode: split_pair(lab, mode))


def correct(observe: Any) -> int:
    return redteam.paired_accuracy(observe, TRAIN, TRIALS, seed=0)["correct"]


def test_a_caught_cancel_shows_the_release_nothing(lab: Lab, updated: tuple[str, str]) -> None:
    """The release's node in EXPLAIN after cancels caught in the same statement: no better than
    a coin in oblivious mode; with the helpers' PL/pgSQL forms it shows the release's blocks,
    which differ between the neighbours (the UPDATE's dead row version), and gets them right."""
    release = f"{redteam.EPSILON}"
    observe = redteam.cancel_attack(lab, updated, release, 0.35)
    assert correct(observe) <= DEFENDED_MOST
    assert min(observe.caught) >= 1  # type: ignore[attr-defined]  # every statement attacked
    with redteam.without_the_library(lab):
        assert correct(redteam.cancel_attack(lab, updated, release, 0.35)) >= CONTROL_LEAST


def test_serializable_leaves_no_lock_to_count(lab: Lab, updated: tuple[str, str]) -> None:
    assert correct(redteam.serializable_attack(lab, updated)) <= DEFENDED_MOST


def test_hostile_planner_settings_tell_nothing(lab: Lab, updated: tuple[str, str]) -> None:
    assert correct(redteam.planner_attack(lab, updated, hostile=True)) <= DEFENDED_MOST


@pytest.mark.parametrize(
    ("mode", "role", "leaks"),
    [
        ("live", "reader", False),
        ("live", "accepted", True),
        ("live", "setter", False),
        ("copy", "reader", False),
        ("copy", "accepted", False),
    ],
)
def test_pg_statio_of_the_python_api(
    lab: Lab, split: Callable[[str], tuple[str, str]], mode: str, role: str, leaks: bool
) -> None:
    """A vote that split a page of the score index, then VACUUM. A role that may not set
    track_counts is refused every oblivious release (ObliviousReadsSeen, before anything is
    read), so pg_statio shows nothing of them; on a table that accepts the channel its releases
    run, and on the live table they leave one more index block in pg_statio on the neighbour
    (the residue docs/promise.md states); a role that may set it leaves none, and a rank-ordered
    copy made after the votes reads the same blocks on both."""
    schemas = split(mode)
    observe = redteam.statio_attack(lab, schemas, role, mode)
    got = correct(observe)
    attempts = 2 + 2 * (TRAIN + TRIALS)  # the metapages' release of each table, then observed
    assert observe.refused[0] == (attempts if role == "reader" else 0)  # type: ignore[attr-defined]
    if leaks:
        assert got >= CONTROL_LEAST
    else:
        assert got <= DEFENDED_MOST


def test_the_distinguisher_on_known_observations() -> None:
    """paired_accuracy itself: one block more on the neighbour is found every time; equal
    observations give the seeded coin (the same count on every run); Gaussian noise with the
    neighbour's mean one spread higher is found about Phi(1 / sqrt(2)) = 0.76 of the time
    (within 0.1 over 400 trials), and the interval holds the accuracy."""
    rng = np.random.default_rng(5)
    one_more = redteam.paired_accuracy(lambda side: np.array([100.0 + side, 7.0]), 4, 50)
    assert one_more["correct"] == 50 and one_more["ties"] == 0
    equal = redteam.paired_accuracy(lambda side: np.zeros(3), 4, 50)
    assert equal["ties"] == 50
    assert equal == redteam.paired_accuracy(lambda side: np.zeros(3), 4, 50)
    noisy = redteam.paired_accuracy(lambda side: rng.normal(side, 1.0, 1), 30, 400)
    assert abs(noisy["accuracy"] - 0.76) < 0.1
    assert noisy["ci95"][0] <= noisy["accuracy"] <= noisy["ci95"][1]
