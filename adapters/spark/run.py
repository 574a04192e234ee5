"""A run of a SparkTable (`snapshot()`): which state of the data it reads, chosen before any noise.

A run reads the version of the copy current at its start, proven to hold the source as it is
(the fingerprint, or one pass comparing m and a hash of the contents) unless the table is
`frozen`. Where the copy is not current, the ski-rental rule (direct.py: Karlin, Manasse,
Rudolph, Sleator 1988) chooses between reading the table itself and refreshing the copy: the
table while the seconds spent reading it on this version (the rent) and this release's stay
below one refresh, then a refresh. A read only the copy serves, in a run on the table itself,
refreshes the copy to the state the run started from (`to_copy`). The choice and its prices are
recorded in `last_freshness` (the release's `diagnostics.plan["freshness"]`).

Cost: one storage listing per run (Hadoop calls, or one Spark job on Spark Connect), plus the
pass or the write the choice makes.
"""

from __future__ import annotations

import time
from typing import Any

from topk_middleware.access import AccessError

from .direct import Direct, prepare_seconds, price
from .layout import STORE_COSTS, Run, Version
from .source import source_listing
from .versions import (
    READERS,
    READERS_LOCK,
    collect,
    current_version,
    differs,
    latest,
    new_version_name,
    source_facts_kept,
    version_data,
    write,
    write_version,
)


def open_run(t: Any) -> Run:
    """The state of a new run, and `last_freshness`: how it knows its data current."""
    fingerprint, frame, listing = source_listing(t)
    version = current_version(t, listing.versions)
    if version is None:
        raise AccessError(f"{t.where} has no rank-ordered copy: call prepare()")
    if len(listing.versions) > t.keep:  # superseded versions whose grace has passed
        collect(t, listing.versions)
    proof = "frozen" if t.frozen else ("fingerprint" if fingerprint else "content pass")
    freshness: dict[str, Any] = {"proof": proof, "version": version.name}
    t.last_freshness = freshness
    why = None if t.frozen else differs(t, version, fingerprint, frame)
    if why is None:
        freshness["path"] = "copy"
        return copy_run(t, version)
    freshness["current"] = False
    facts = why[1]
    known = facts is not None or (
        fingerprint and t._facts is not None and t._facts[0] == fingerprint
    )
    table_seconds, refresh_seconds = price(version.m, bool(known))
    basis = "modelled"
    if t._prepared is not None:  # this object's last write, measured, scaled to m
        m_then, seconds = t._prepared
        refresh_seconds += seconds * version.m / max(m_then, 1) - prepare_seconds(m_then)
        basis = "measured"
    rent = t._rent.get(version.name, 0.0)
    freshness.update(
        table_seconds=table_seconds,
        refresh_seconds=refresh_seconds,
        refresh_basis=basis,
        rent_seconds=rent,
    )
    if t._oblivious or rent + table_seconds >= refresh_seconds:
        freshness["path"] = "refreshed"
        freshness["why"] = "oblivious" if t._oblivious else "ski rental"
        name = write(t, fingerprint, frame, listing)
        freshness["version"] = name
        return copy_run(t, t._versions[name])
    freshness["path"] = "table"
    if facts is None:
        facts = source_facts_kept(t, frame, fingerprint, version.m)
    # the refresh a read only the copy serves would make, as the ski rental prices it,
    # without the threshold run on the new copy (the planner prices that on the copy)
    refresh_only = max(0.0, refresh_seconds - 3 * STORE_COSTS.round_trip)
    return Run(None, None, direct=Direct(frame, fingerprint, facts, table_seconds, refresh_only))


def copy_run(t: Any, version: Version) -> Run:
    """A run on `version` of the copy, counted among its readers (never deleted under it)."""
    with READERS_LOCK:
        READERS[(t.copy, version.name)] += 1
    return Run(version, version_data(t, version))


def release(t: Any, run: Run) -> None:
    """The end of a run: its version no longer counts it among its readers."""
    if run.version is not None:
        with READERS_LOCK:
            READERS[(t.copy, run.version.name)] -= 1


def to_copy(t: Any, run: Run) -> None:
    """A read only the copy serves, in a run on the table itself: refresh the copy to the
    state the run started from (checked: fingerprint, or m and the content's hash), and go
    on on the new version."""
    direct = run.direct
    fingerprint, frame, listing = source_listing(t)
    if fingerprint != direct.fingerprint:
        raise AccessError(f"{t.where} changed during the run: retry")
    m, content = t.validate(frame)
    if (m, content) != (direct.facts.m, direct.facts.content):
        raise AccessError(f"{t.where} changed during the run: retry")
    name = new_version_name()
    write_version(t, name, m, content, fingerprint, frame)
    versions = dict(listing.versions)
    versions[name] = int(time.time() * 1000)
    collect(t, versions)
    version = t._versions[name]
    with READERS_LOCK:
        READERS[(t.copy, name)] += 1
    run.version, run.data, run.direct = version, version_data(t, version), None
    if t.last_freshness is not None:
        t.last_freshness.update(path="refreshed", why="a read only the copy serves")
        t.last_freshness["version"] = name


def state(t: Any) -> Run:
    """The state of the run in progress, or outside a run one on the current version."""
    if t._run is not None:
        return t._run
    version = latest(t)
    if version is None:
        raise AccessError(f"{t.where} has no rank-ordered copy: call prepare()")
    return Run(version, version_data(t, version))


def copy_state(t: Any) -> Run:
    """The run's state on the copy (a run on the table itself refreshes it first)."""
    run = state(t)
    if run.direct is not None:
        to_copy(t, run)
    return run
