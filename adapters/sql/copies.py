"""Where a copy lives and how a refresh replaces it: the copy layouts of the SQL store engine.

A layout makes, finds, opens and drops one table's rank-ordered copy (engine.py). Two:

* `NamedCopy`: the rank table and its runs table under fixed names. prepare()
  builds them, with their indexes, in one transaction of the dialect's snapshot isolation
  (validation and copy read one state); a refresh builds new tables beside the old ones and
  swaps them in at the end of that transaction (drop, rename: no dead rows), waiting for the
  runs still reading the old ones at most `swap_timeout` seconds (then TimeoutError, nothing
  changed). Concurrent prepares of one copy wait for each other (the dialect's session lock);
  each statement has `statement_timeout` seconds. The copy's record is its comment: the first
  line its fingerprint (a rank table that prepare() did not build, or built from an earlier
  table of this name, is refused: RankTableMismatchError), the next ones the freshness proof's
  stamp (freshness.py) and the change log's (around.py). A run's first query reads m (the last
  rank, by the rank index), the number of runs of tied scores (the last run's number, by the
  runs table's key), the record, the fingerprint and the proof: one statement.
* `VersionedCopy`: numbered versions (`topk_<digest>_rank_<n>`, `_runs_<n>`) listed in a
  manifest (version, fingerprint, m, runs), for stores without transactions to hold a run's
  snapshot while a refresh swaps tables: a run reads the version current when it
  started, a refresh adds version n + 1 and drops those before n.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from adapters._sql import (
    FINGERPRINT_TAG,
    AccessCheck,
    AccessPath,
    RankTableMismatchError,
    rows_from_records,
)

from .engine import Run

KEEP_VERSIONS = 2  # the current version and the one a run in progress may still read


@dataclass(frozen=True)
class CopyNames:
    """The names of one copy's objects in the store (unqualified), and their namespace."""

    namespace: str | None
    ranks: str
    runs: str
    rank_index: str
    id_index: str
    beside: tuple[str, str, str, str]  # a refresh's ranks, runs, rank index, id index


class NamedCopy:
    """The copy under fixed names, its record in its comment (module docstring)."""

    reads_around = True

    def __init__(self, t: Any, names: CopyNames) -> None:
        self.t, self.names, self.d = t, names, t.dialect
        q = self.d.qualified
        self.ranks, self.runs = q(names.namespace, names.ranks), q(names.namespace, names.runs)

    # ----- the catalog ------------------------------------------------------------------------
    def _catalog(self) -> tuple[bool, bool, bool]:
        """Whether the rank table, the runs table and the proof's log exist: one lookup (a
        query naming a missing table would abort the transaction)."""
        e = self.d.exists_sql
        row = self.t.driver.one(
            f"SELECT {e(self.ranks)}, {e(self.runs)}, {self.t.proof.exists_sql()}"
        )
        return bool(row[0]), bool(row[1]), bool(row[2])

    def exists(self) -> bool:
        return self._catalog()[0]

    # ----- a run -----------------------------------------------------------------------------
    def open(self, strict: bool, runs: bool = True) -> Run | None:
        """In the run's transaction: the copy, m, its runs of tied scores and why it is not
        proven current (None: it is, or is frozen), in one query (module docstring)."""
        ranked, with_runs, logged = self._catalog()
        if not ranked:
            return None
        d = self.d
        count = (
            f"(SELECT run + 1 FROM {self.runs} ORDER BY first_rank DESC LIMIT 1)"
            if with_runs and runs
            else "CAST(NULL AS BIGINT)"
        )
        stored = d.comment_sql(self.ranks)
        current = d.fingerprint_sql(self.t, self.ranks)
        proof = self.t.proof.proof_sql(self, logged)
        m, runs_count, record, fingerprint, proven = self.t.driver.one(
            f"SELECT coalesce(max(rank) + 1, 0), {count}, {stored}, {current}, {proof} "
            f"FROM {self.ranks}",
            prepare=True,  # the proof's catalog subqueries cost ~1-3 ms to plan
        )
        why = None if self._belongs(record, fingerprint, strict) else "another table"
        if why is None:
            why = self.t.proof.why(record, proven)
        return Run(
            "copy",
            int(m),
            self.ranks,
            self.runs if runs_count is not None else None,
            None if runs_count is None else int(runs_count),
            record=record,
            why=why,
        )

    def _belongs(self, stored: str | None, current: str, strict: bool) -> bool:
        """Whether the copy was built from this table (its record's first line). One prepare()
        did not build raises RankTableMismatchError; so does one built from an earlier table
        of this name (dropped and re-created, renamed in, its columns changed) where `strict`,
        while a run that is not frozen reads the table instead (False)."""
        first = None if stored is None else stored.split("\n")[0]
        if first == current:
            return True
        built = first is not None and first.startswith(FINGERPRINT_TAG)
        if built and not strict:
            return False
        why = (
            "prepare() did not build it"
            if not built
            else "it was built from an earlier table of this name, or its columns changed"
        )
        raise RankTableMismatchError(
            f"{self.t.where}: the rank table {self.names.ranks!r} does not belong to this table "
            f"({why}): call prepare(refresh=True)"
        )

    def stamp_sql(self) -> str:
        """SQL of the freshness proof's stamp recorded with the copy (its record's second
        line)."""
        return self.d.comment_line_sql(self.ranks, 2)

    def read_runs(self, run: Run) -> Any:
        return self.d.read_runs(self.t.driver, run.runs, run.run_count)

    def around_state(self, run: Run) -> Any:
        from .around import around_state

        return around_state(self.t, self, run)

    def around_oneshot(self, run: Run, noise: Any, k: int) -> Any:
        from .around import around_oneshot

        return around_oneshot(self.t, self, run, noise, k)

    # ----- prepare ---------------------------------------------------------------------------
    def prepare(self, refresh: bool = False, **options: Any) -> None:
        """Build the copy where it is missing, not this table's, or with `refresh` (module
        docstring); ANALYZE what was built. Options: `statement_timeout` (seconds a statement
        may take; None: the server's setting) and `swap_timeout`, the dialect's by default."""
        t, d = self.t, self.d
        statement_timeout = options.get("statement_timeout", d.prepare_statement_timeout)
        swap_timeout = options.get("swap_timeout", d.swap_timeout)
        if not swap_timeout > 0:
            raise ValueError(f"swap_timeout must be > 0 seconds, got {swap_timeout}")
        if statement_timeout is not None and not statement_timeout > 0:
            raise ValueError(f"statement_timeout must be > 0 seconds, got {statement_timeout}")
        built = False
        with t.driver.session(), d.prepare_lock(t.driver, self.ranks):
            try:
                with t.driver.transaction():  # committed before the copy's snapshot
                    d.limit_statements(t.driver, statement_timeout)
                    t.proof.install(self)
                with t.driver.transaction(isolation=d.snapshot_isolation):
                    d.limit_statements(t.driver, statement_timeout)
                    built = self._prepare_locked(refresh, float(swap_timeout))
            except BaseException as error:
                if not t.driver.lost():
                    with t.driver.transaction():
                        if not self.exists():  # refused or stopped: nothing left behind
                            t.proof.uninstall(self)
                if isinstance(error, t.driver.errors) and d.canceled(t.driver, error):
                    raise TimeoutError(
                        f"{t.where}: prepare() was stopped by its statement_timeout of "
                        f"{statement_timeout} s; nothing was changed"
                    ) from None
                raise
        if built:
            for table in (self.ranks, self.runs):
                t.driver.execute(d.analyze_sql(table))

    def _prepare_locked(self, refresh: bool, swap_timeout: float) -> bool:
        """prepare() inside its transaction and lock; whether tables were built."""
        t, d = self.t, self.d
        ranked, with_runs, _ = self._catalog()
        if ranked and not refresh:
            stored, current = t.driver.one(
                f"SELECT {d.comment_sql(self.ranks)}, {d.fingerprint_sql(t, self.ranks)}"
            )
            if stored is None or not stored.startswith(FINGERPRINT_TAG):
                raise RankTableMismatchError(
                    f"{t.where}: a table named {self.names.ranks!r} exists but prepare() did "
                    "not build it (no fingerprint): drop it, pass another rank_table name, or "
                    "call prepare(refresh=True) to replace it"
                )
            refresh = stored.split("\n")[0] != current  # an earlier table of this name
        if not ranked or refresh:
            t.validate()
            n = self.names
            beside = [d.qualified(n.namespace, name) for name in n.beside[:2]]
            target = beside if ranked else [self.ranks, self.runs]
            indexes = n.beside[2:] if ranked else (n.rank_index, n.id_index)
            self._build(*target, *indexes)
            if ranked:
                self._swap(beside, with_runs, swap_timeout)
            fingerprint = t.driver.scalar(f"SELECT {d.fingerprint_sql(t, self.ranks)}")
            lines = [fingerprint, *t.proof.stamp(self)]
            t.driver.execute(d.comment_statement(self.ranks, "\n".join(lines)))
            return True
        for index, column in ((self.names.rank_index, "rank"), (self.names.id_index, "id")):
            t.driver.execute(d.create_index_sql(index, self.ranks, column, if_missing=True))
        if not with_runs:
            self._create_runs(self.runs, self.ranks)
            return True
        return False

    def _build(self, ranks: str, runs: str, rank_index: str, id_index: str) -> None:
        """The rank table, its B-trees and its runs table under the given names."""
        t, d = self.t, self.d
        for table in (ranks, runs):
            t.driver.execute(d.drop_table(table))  # only a refresh's names: left by a kill
        for statement in d.create_rank_table(ranks, t.canonical_rows()):
            t.driver.execute(statement)
        for index, column in ((rank_index, "rank"), (id_index, "id")):
            t.driver.execute(d.create_index_sql(index, ranks, column))
        self._create_runs(runs, ranks)

    def _create_runs(self, runs: str, ranks: str) -> None:
        for statement in self.d.create_runs_table(runs, ranks):
            self.t.driver.execute(statement)

    def _swap(
        self, beside: list[str], with_runs: bool, timeout: float, indexes: bool = True
    ) -> None:
        """The new tables in place of the old ones: drop the old ones and rename the new ones
        and their indexes (the short, exclusive end of a refresh). Dropping waits for the runs
        reading the old tables at most `timeout` seconds; a run still open then makes the
        refresh give up (TimeoutError; the whole transaction is rolled back)."""
        t, d, n = self.t, self.d, self.names
        old = [self.ranks, self.runs] if with_runs else [self.ranks]
        try:
            with t.driver.savepoint():
                d.lock_timeout(t.driver, timeout)
                t.driver.execute(f"DROP TABLE {', '.join(old)}")
        except t.driver.errors as error:
            if not d.lock_not_available(t.driver, error):
                raise
            raise TimeoutError(
                f"{t.where}: prepare(refresh=True) waited {timeout} s (swap_timeout) for runs "
                f"still reading the rank table {n.ranks!r}; nothing was changed: try again when "
                "they have ended, or pass a longer swap_timeout"
            ) from None
        d.lock_timeout(t.driver, None)
        for new, name in zip(beside, (n.ranks, n.runs), strict=True):
            t.driver.execute(d.rename_table_sql(new, name))
        if indexes:
            for new, name in zip(n.beside[2:], (n.rank_index, n.id_index), strict=True):
                t.driver.execute(d.rename_index_sql(d.qualified(n.namespace, new), name))

    # ----- cleanup and checks -----------------------------------------------------------------
    def uninstall(self) -> None:
        """Drop the rank and runs tables (their indexes and record go with them) and the
        proof's objects, in one transaction. A rank table prepare() did not build (no
        fingerprint) is refused and nothing is dropped. Waits for runs still reading it."""
        t, d = self.t, self.d
        with t.driver.transaction():
            exists, stored = t.driver.one(
                f"SELECT {d.exists_sql(self.ranks)}, {d.comment_sql(self.ranks)}"
            )
            if exists:
                if stored is None or not stored.startswith(FINGERPRINT_TAG):
                    raise RankTableMismatchError(
                        f"{t.where}: the table {self.names.ranks!r} was not built by prepare() "
                        "(no fingerprint): uninstall() leaves it alone"
                    )
                t.driver.execute(f"DROP TABLE IF EXISTS {self.runs}, {self.ranks}")
            t.proof.uninstall(self)

    def check(self) -> AccessCheck:
        """How each access kind will be served: the dialect's EXPLAIN of each read, where an
        index can serve it (full scans named)."""
        t, d = self.t, self.d
        ranked, runs, _ = self._catalog()
        source = self.ranks if ranked else f"({t.canonical_rows()})"
        sample = [r[0] for r in t.driver.execute(f"SELECT {t.id_sql} FROM {t.source} LIMIT 3")]
        kind = "text" if t.text_ids else "integer" if t.integer_ids else None
        probes = [
            (
                "sorted",
                f"SELECT rank, id, score FROM {source} AS r WHERE rank >= 0 AND rank < 100 "
                "ORDER BY rank"
                if ranked
                else f"SELECT {t.id_sql}, {t.score_sql} FROM {t.source} ORDER BY "
                f"{t.score_sql} DESC, {t.id_sql} LIMIT 100",
                {},
            ),
            (
                "random by rank",
                f"SELECT r.rank, r.id, r.score FROM {source} AS r "
                f"WHERE {d.member('r.rank', 'ranks', 'integer')} ORDER BY r.rank",
                {"ranks": d.array_value([1, 2, 3], "integer", t.driver)},
            ),
            (
                "random by id",
                f"SELECT id, score FROM {self.ranks} WHERE {d.member('id', 'ids', kind)}"
                if ranked
                else f"SELECT {t.id_sql}, {t.score_sql} FROM {t.source} "
                f"WHERE {d.member(t.id_sql, 'ids', kind)}",
                {"ids": d.array_value(sample, kind, t.driver)},
            ),
        ]
        paths = []
        with t.driver.transaction():
            d.no_sequential_scans(t.driver)
            for access, query, params in probes:
                scans = d.full_scans(t.driver, query, params)
                how = (f"sequential scan of {', '.join(scans)}" if scans else "index scan") + (
                    "" if ranked else f" (no rank table {self.names.ranks!r}: call prepare())"
                )
                if ranked and access == "random by rank":
                    how += (
                        f"; scores of tied runs from {self.names.runs!r}"
                        if runs
                        else f" (no runs table {self.names.runs!r}: call prepare())"
                    )
                paths.append(AccessPath(access, bool(scans), how))
        return AccessCheck(t.where, paths)


@dataclass
class _Version:
    """One built copy, as the manifest records it."""

    number: int
    fingerprint: str
    m: int
    runs: int


class VersionedCopy:
    """The copy as numbered versions listed in a manifest (module docstring); names
    topk_<digest>_..., the digest of the table's resolved (namespace, name), so that any
    spelling finds them."""

    reads_around = False

    def __init__(self, t: Any) -> None:
        self.t, self.d = t, t.dialect
        digest = hashlib.sha256(f"{t.namespace}\0{t.table}".encode()).hexdigest()[:12]
        self.prefix = f"topk_{digest}"
        self.manifest = self.d.qualified(t.namespace, f"{self.prefix}_manifest")

    def _name(self, what: str, number: int) -> str:
        return self.d.qualified(self.t.namespace, f"{self.prefix}_{what}_{number}")

    def _versions(self) -> list[_Version]:
        t = self.t
        if f"{self.prefix}_manifest" not in self.d.tables_like(t.driver, t.namespace, self.prefix):
            return []
        rows = t.driver.execute(
            f"SELECT version, fingerprint, m, runs FROM {self.manifest} ORDER BY version"
        )
        return [_Version(int(v), str(f), int(m), int(r)) for v, f, m, r in rows]

    def exists(self) -> bool:
        return bool(self._versions())

    def open(self, strict: bool, runs: bool = True) -> Run | None:
        """The latest version and whether its fingerprint is the table's now."""
        versions = self._versions()
        if not versions:
            return None
        latest = versions[-1]
        why = None if self.t.frozen else self.t.proof.why(latest.fingerprint, None)
        n = latest.number
        ranks, runs_table = self._name("rank", n), self._name("runs", n)
        return Run("copy", latest.m, ranks, runs_table, latest.runs, why=why)

    def read_runs(self, run: Run) -> Any:
        import numpy as np

        rows = self.t.driver.execute(
            f"SELECT first, {self.d.double('score')} FROM {run.runs} ORDER BY first"
        )
        got = rows_from_records([(r[0], 0, r[1]) for r in rows])
        return got.positions, np.asarray(got.scores, np.float64)

    def prepare(self, refresh: bool = False, **options: Any) -> None:
        """Build version n + 1 (the table's fingerprint read before the build starts, so a write
        during it makes the copy stale, never wrongly current); without `refresh`, a current
        copy is kept."""
        t, d = self.t, self.d
        versions = self._versions()
        if (
            versions
            and not refresh
            and (t.frozen or t.proof.why(versions[-1].fingerprint, None) is None)
        ):
            return
        number = versions[-1].number + 1 if versions else 1
        fingerprint = t.proof.fingerprint()
        ranks, runs = self._name("rank", number), self._name("runs", number)
        t.validate()
        for statement in d.create_rank_table(ranks, t.canonical_rows()):
            t.driver.execute(statement)
        try:
            t.check_copy(ranks)
        except BaseException:
            t.driver.execute(d.drop_table(ranks))
            raise
        for statement in d.create_runs_table(runs, ranks):
            t.driver.execute(statement)
        m = int(t.driver.scalar(f"SELECT count(*) FROM {ranks}"))
        count = int(t.driver.scalar(f"SELECT count(*) FROM {runs}"))
        t.driver.execute(d.create_manifest(self.manifest))
        t.driver.execute(
            d.record_version_sql(self.manifest),
            {"version": number, "fingerprint": fingerprint, "m": m, "runs": count},
        )
        for old in versions[: max(0, len(versions) + 1 - KEEP_VERSIONS)]:
            t.driver.execute(d.drop_table(self._name("rank", old.number)))
            t.driver.execute(d.drop_table(self._name("runs", old.number)))
            t.driver.execute(d.forget_version_sql(self.manifest), {"version": old.number})

    def uninstall(self) -> None:
        """Drop every table prepare() made for this table (never the table itself)."""
        t = self.t
        for name in self.d.tables_like(t.driver, t.namespace, self.prefix):
            if name != t.table:
                t.driver.execute(self.d.drop_table(self.d.qualified(t.namespace, name)))

    def check(self) -> AccessCheck:
        """Reads by rank are reads of the copy ordered by rank; by id, a scan of the copy."""
        ok = "the copy, ordered by rank" if self.exists() else "no copy: call prepare()"
        return AccessCheck(
            self.t.where,
            [
                AccessPath("sorted", not self.exists(), ok),
                AccessPath("random by rank", not self.exists(), ok),
                AccessPath("random by id", True, "a scan of the copy's ids"),
            ],
        )


__all__ = ["KEEP_VERSIONS", "CopyNames", "NamedCopy", "VersionedCopy"]
