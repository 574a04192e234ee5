"""DuckDB's copy layout: the rank table, its index and runs table, and the fingerprint in its
comment (the engine's layout interface, adapters/sql/copies.py).

DuckDB has no index-driven ORDER BY, so prepare() writes a rank-ordered copy (rank, id, score)
of the table in rank order: its row ids are ranks, and the zone maps of the rank column let a
range skip every other row group. A unique ART index on rank serves short batches of reads by
rank; the runs table (first_rank, score) holds the runs of tied scores. With the copy, for a
table (a view has no row order), a refresh by delta's shadow and empty delta (delta.py).

The fingerprint in the rank table's comment (fingerprint.py) tells a run whether the copy
belongs to the table.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from adapters._sql import (
    FINGERPRINT_TAG,
    AccessCheck,
    AccessPath,
    RankTableMismatchError,
)
from adapters.sql.engine import Run

from . import CATALOG_SCAN_MAX, WHERE_SCHEMA, literal
from .delta import (
    CACHE_MAX_ROWS,
    DeltaNames,
    DeltaRefresh,
    DeltaView,
    RefreshReport,
    empty_delta_sql,
    load_cache,
    parse_delta_comment,
    shadow_sql,
)
from .fingerprint import NOT_BUILT, ROWS_DIFFER, Fingerprints, head_of
from .reads import CopyReads, DeltaReads


class Gone(Exception):
    """The rank table (or its runs table) is not in the catalog of this snapshot."""


class DuckDBCopy:
    """One table's copy (module docstring), for the engine's table `t` (adapters/duckdb.py
    DuckDBTable: names `rank_table`, `runs_table`, `shadow_table`, `delta_table`,
    `skip_table`)."""

    reads_around = False

    def __init__(self, t: Any) -> None:
        self.t, self.d, self.driver = t, t.dialect, t.driver
        q = self.d.qualified
        ns = t.namespace
        self.ranks, self.runs = q(ns, t.rank_table), q(ns, t.runs_table)
        self.rank_index = t.rank_table + "_rank"
        self.names = DeltaNames(
            base=self.ranks,
            shadow=q(ns, t.shadow_table),
            delta=q(ns, t.delta_table),
            skip=q(ns, t.skip_table),
            table=t.source,
            id=t.id_sql,
            score=t.score_sql,
            collate=' COLLATE "binary"' if t.text_ids else "",
            runs=self.runs,
        )
        self.seen_prepared = False  # the last catalog lookup found all that prepare() builds
        # The table's catalog oid when this object last built or verified the rank table: an
        # identity within this open database only (oids are handed out again on reopen).
        self.proven_oid: int | None = None
        self._stamped_oid: int | None = None
        self.fingerprints = Fingerprints(t)
        self.head: Any = None  # the base's first rows, from the fingerprint the last run read
        self._delta_tables_seen = False  # the delta and skip tables were found (never dropped)
        self._delta_sizes: tuple[Any, ...] | None = None  # (delta, skip, gen), from _counts()
        self._delta_cache: Any = None  # the last delta generation read (delta.DeltaCache)
        self._view: bool | None = None
        self.home()  # here, not in the first run: every run makes the same statements

    # ----- the catalog ------------------------------------------------------------------------
    def catalog(self) -> tuple[bool, bool, bool]:
        """Whether the rank table, its index on rank and the runs table exist: one catalog
        lookup, which cannot abort a transaction (a query on a missing table would)."""
        t = self.t
        table, index, runs = self.driver.one(
            f"SELECT (SELECT count(*) FROM duckdb_tables() WHERE {WHERE_SCHEMA} "
            "AND lower(table_name) = lower(:table)), "
            f"(SELECT count(*) FROM duckdb_indexes() WHERE {WHERE_SCHEMA} "
            "AND lower(index_name) = lower(:index)), "
            f"(SELECT count(*) FROM duckdb_tables() WHERE {WHERE_SCHEMA} "
            "AND lower(table_name) = lower(:runs))",
            {
                "schema": t.namespace,
                "table": t.rank_table,
                "index": self.rank_index,
                "runs": t.runs_table,
            },
        )
        return bool(table), bool(table) and bool(index), bool(table) and bool(runs)

    def exists(self) -> bool:
        return self.catalog()[0]

    def has_delta_layout(self) -> bool:
        """Whether the rank table, its shadow and the delta and skip tables all exist (one
        catalog lookup, which cannot abort a transaction)."""
        t = self.t
        names = [t.rank_table, t.shadow_table, t.delta_table, t.skip_table]
        found = self.driver.scalar(
            f"SELECT count(DISTINCT lower(table_name)) FROM duckdb_tables() WHERE {WHERE_SCHEMA} "
            "AND lower(table_name) IN (SELECT lower(unnest(:names)))",
            {"schema": t.namespace, "names": names},
        )
        return int(found) == len(names)

    def home(self) -> tuple[str, str]:
        """(database, lower-case schema) of the table, looked up once (table.CatalogHints)."""
        return self.d.hints.home(self.t)

    def is_view(self) -> bool:
        """Whether the table is a view (its row count is a query, not kept in the fingerprint)."""
        if self._view is None:
            self._view = bool(
                self.driver.scalar(
                    f"SELECT count(*) FROM duckdb_views() WHERE {WHERE_SCHEMA} "
                    "AND lower(view_name) = lower(:table)",
                    {"schema": self.t.namespace, "table": self.t.table},
                )
            )
        return self._view

    def lookup(self, full: bool, also: Sequence[str] = ()) -> tuple[Any, ...]:
        """(stored fingerprint, table's oid, table's definition, table's row count, the comments
        of the tables `also` (in the rank table's schema) that exist, by lower-case name): one
        plain scan of the catalog's tables (about 0.2 ms; filters, functions and aggregates in
        it cost several times more), filtered here. Once the copy is proven to this object
        (`full` False), the table's oid settles its identity (an ALTER keeps it; the copy stays
        the snapshot it was): the mark and the oid only. Before that, also the definition (a
        view's from the catalog's views) and, for a table, the row count (from metadata)."""
        t = self.t
        home = self.home()
        names = (t.rank_table.lower(), t.table.lower(), *(n.lower() for n in also))
        wanted = set(names)
        where = ""
        if self.d.hints.catalog_rows > CATALOG_SCAN_MAX:
            where = f" WHERE lower(table_name) IN ({', '.join(literal(n) for n in names)})"
        listed = self.driver.execute(
            "SELECT database_name, schema_name, table_name, table_oid, comment, "
            # the definition only where it is compared (its text is built per table)
            + ("sql" if full else "NULL AS sql")
            + f" FROM duckdb_tables(){where}"
        )
        if not where:
            self.d.hints.catalog_rows = len(listed)
        found = {
            name.lower(): (oid, comment, sql_text)
            for database, schema, name, oid, comment, sql_text in listed
            if name.lower() in wanted and (database, schema.lower()) == home
        }
        stored = found.get(names[0], (None, None, None))[1]
        oid, _, definition = found.get(names[1], (None, None, None))
        rows = None
        if full:
            if self.is_view():  # a view's row count is its query: not kept
                definition = self.driver.scalar(
                    f"SELECT sql FROM duckdb_views() WHERE {WHERE_SCHEMA} "
                    "AND lower(view_name) = lower(:table)",
                    {"schema": t.namespace, "table": t.table},
                )
            else:
                rows = self.driver.scalar(f"SELECT count(*) FROM {t.source}")
        extra = {name: found[name][1] for name in names[2:] if name in found}
        return stored, oid, definition, rows, extra

    def facts(self) -> tuple[Any, ...]:
        """(stored fingerprint, oid, definition, row count) in the open transaction."""
        return self.lookup(full=True)[:4]

    def stamp(self) -> None:
        """Write the fingerprint of the table, as the open transaction sees it, on the rank
        table (its comment), with a new build mark, the counts of the base and of its runs
        of tied scores, and the base's first rows, all of them in a small copy (what a run reads
        instead of counting or reading them)."""
        _, oid, ddl, rows = self.facts()
        base, runs = self.driver.one(
            f"SELECT (SELECT count(*) FROM {self.ranks}), (SELECT count(*) FROM {self.runs})"
        )
        head = head_of(self.driver, self.ranks, int(base))
        text = self.fingerprints.text(ddl, rows, int(base), int(runs), head)
        self.driver.execute(f"COMMENT ON TABLE {self.ranks} IS {literal(text)}")
        self._stamped_oid = oid

    # ----- a run ------------------------------------------------------------------------------
    def open(self, strict: bool, runs: bool = True) -> Run | None:
        """In the run's transaction: the copy's m, its runs of tied scores and its reads (with
        the delta where one is pending, else the first rows from the fingerprint), after the
        fingerprint check; None without a rank table (the engine warns and reads the table).
        Where this object last saw the rank table, its index and the runs table, the catalog
        scan of the counts is the only query (the transaction begins in it)."""
        counted = None
        if self.seen_prepared:
            try:
                counted = self.counts(True)
            except Gone:
                self.seen_prepared = self._delta_tables_seen = False
        if counted is not None:
            indexed = True
            m, count = counted
        else:
            ranked, indexed, with_runs = self.catalog()
            self.seen_prepared = ranked and indexed and with_runs
            if not ranked:
                return None
            m, count = self.counts(with_runs)
        delta = self._delta(m, count)
        why = None if self.t.frozen else "unprovable"
        if delta is not None:
            reads: Any = DeltaReads(self.t, self, delta, indexed)
            return Run("copy", delta.m, self.ranks, None, None, why=why, reads=reads)
        reads = CopyReads(self.t, self, m, indexed, self.head)
        return Run("copy", m, self.ranks, self.runs if count is not None else None, count, why=why,
                   reads=reads)  # fmt: skip

    def counts(self, with_runs: bool) -> tuple[int, int | None]:
        """m and the number of runs of tied scores (None without a runs table), after the
        fingerprint check, from one scan of the catalog: the counts of the base and its runs are
        in the fingerprint, the delta's sizes in the delta table's comment (a copy written
        before they were is counted: one more query). Raises Gone where the rank table (or the
        runs table, `with_runs`) is not there."""
        t = self.t
        delta, skip = t.delta_table.lower(), t.skip_table.lower()
        layout = (t.shadow_table.lower(), delta, skip)
        stored, oid, ddl, rows, present = self.lookup(
            full=self.proven_oid is None,
            also=(t.rank_table, t.runs_table, t.shadow_table, delta, skip),
        )
        if t.rank_table.lower() not in present or (
            with_runs and t.runs_table.lower() not in present
        ):
            raise Gone
        self.fingerprints.check(stored, oid, ddl, rows, self.proven_oid)
        mark = self.fingerprints.mark_of(stored)
        recorded, self.head = mark.counts, mark.head
        self._delta_tables_seen = seen = all(name in present for name in layout)
        sizes = parse_delta_comment(present.get(delta)) if seen else (0, 0, None)
        parts = []
        if recorded is None:
            runs = f"(SELECT count(*) FROM {self.runs})" if with_runs else "NULL"
            parts.append(f"(SELECT count(*) FROM {self.ranks}), {runs}")
        if sizes is None:  # a delta written before its comment held its sizes
            n = self.names
            parts.append(
                f"(SELECT count(*) FROM {n.delta}), (SELECT count(*) FROM {n.skip}), "
                f"(SELECT gen FROM {n.delta} LIMIT 1)"
            )
        counted = list(self.driver.one(f"SELECT {', '.join(parts)}")) if parts else []
        if recorded is None:
            m, count = counted[:2]
            counted = counted[2:]
        else:
            m, count = recorded
        self._delta_sizes = sizes if sizes is not None else tuple(counted)
        return int(m), None if count is None or not with_runs else int(count)

    def _delta(self, m_base: int, runs: int | None) -> DeltaView | None:
        """A view of the delta where it is non-empty: then m counts it, positions are not ranks
        and there are no runs of tied scores (delta.py)."""
        sizes, self._delta_sizes = self._delta_sizes, None  # counted with m by counts()
        if sizes is None:
            if not self.has_delta_layout():
                return None
            self._delta_tables_seen = True
            n = self.names
            sizes = self.driver.one(
                f"SELECT (SELECT count(*) FROM {n.delta}), (SELECT count(*) FROM {n.skip}), "
                f"(SELECT gen FROM {n.delta} LIMIT 1)"
            )
        delta, skip, gen = sizes
        if not (delta or skip):
            return None
        cache = self._delta_cache
        if not self.t.text_ids and delta <= CACHE_MAX_ROWS and gen is not None:
            if cache is None or cache.gen != gen:  # once per delta generation
                cache = load_cache(self.driver, self.names, int(gen), runs is not None)
                self._delta_cache = cache
        else:
            cache = None
        return DeltaView(self.driver, self.names, m_base, int(delta), int(skip), runs, cache)

    def read_runs(self, run: Run) -> tuple[np.ndarray, np.ndarray]:
        """(first rank, score) of every run of tied scores, in rank order."""
        got = self.driver.arrays(f"SELECT first_rank, score FROM {self.runs} ORDER BY first_rank")
        return np.asarray(got["first_rank"], dtype=np.int64), np.asarray(got["score"], float)

    # ----- prepare and refresh ------------------------------------------------------------------
    def prepare(self, refresh: bool = False, *, full: bool = False) -> None:
        """Create the copy if it is missing (or bring it up to date): DuckDBTable.prepare."""
        t = self.t
        if refresh and not full and self.has_delta_layout():
            stored, _, ddl, rows = self.facts()
            why = self.fingerprints.mismatch(stored, ddl, rows)
            if why is None or why.startswith(ROWS_DIFFER):  # a delta finds the rest
                self.refresh()  # a delta against the shadow: any change is found by the pass
                return
        self.seen_prepared = False
        ranked, indexed, with_runs = self.catalog()
        build = refresh or not ranked
        with self.driver.transaction():
            if not build:
                build = not self._belongs()
            if not build and indexed and with_runs:
                return
            if build:
                t.validate()
                for statement in self.d.create_rank_table(self.ranks, t.canonical_rows()):
                    self.driver.execute(statement)
            self.driver.execute(
                self.d.create_index_sql(self.rank_index, self.ranks, "rank", if_missing=True)
            )
            if build or not with_runs:
                for statement in self.d.create_runs_table(self.runs, self.ranks):
                    self.driver.execute(statement)
            if build:
                self._write_base_extras()
                self.stamp()  # with the counts of the base and its runs
        if build:
            self.proven_oid = self._stamped_oid

    def _belongs(self) -> bool:
        """For prepare() without refresh, in its transaction: whether the existing copy belongs
        to the table (keep it) or not (rebuild it). A copy prepare() did not build is refused."""
        stored, oid, ddl, rows = self.facts()
        why = self.fingerprints.mismatch(stored, ddl, rows)
        if why == NOT_BUILT:
            raise RankTableMismatchError(
                f"{self.t.where}: a table named {self.t.rank_table!r} exists but prepare() did "
                "not build it (no fingerprint): drop it, pass another rank_table name, or call "
                "prepare(refresh=True) to replace it"
            )
        if self.proven_oid is not None and oid == self.proven_oid:
            return why is None or why.startswith(ROWS_DIFFER)  # the same table, maybe stale
        if why is not None:
            return False
        self.proven_oid = None  # not proven: compare the copy with the table
        if self.differs():
            return False
        self.proven_oid = oid
        return True

    def _write_base_extras(self) -> None:
        """With a new base, in its transaction: its shadow and an empty delta. Only for a table
        (a view has no row order to keep a shadow in: its refresh is a full rebuild)."""
        is_table = self.driver.scalar(
            f"SELECT count(*) FROM duckdb_tables() WHERE {WHERE_SCHEMA} "
            "AND lower(table_name) = lower(:table)",
            {"schema": self.t.namespace, "table": self.t.table},
        )
        if not is_table:
            return
        self.driver.execute(shadow_sql(self.names))
        for statement in empty_delta_sql(self.names):
            self.driver.execute(statement)

    def refresh(self) -> RefreshReport:
        """DuckDBTable.refresh: one pass and a small delta, or a full build (delta.py); the
        report is also the table's `last_refresh`."""
        self.t.last_refresh = report = self._refresh()
        return report

    def _refresh(self) -> RefreshReport:
        t = self.t
        if not self.has_delta_layout():
            self.prepare(refresh=True, full=True)
            return RefreshReport("build", m=t.domain_size())
        job = DeltaRefresh(self.driver, self.names, t.where)
        keep = False
        try:
            with self.driver.transaction():
                keep = job.find_changes(t.fold_fraction)
                if not keep:
                    raise _Fold
                job.write_delta()
                self.stamp()  # the table's row count as this refresh saw it
        except _Fold:
            pass
        if keep:
            self.proven_oid = self._stamped_oid
            return job.report
        self.prepare(refresh=True, full=True)
        job.report.kind = "fold"
        job.report.delta_rows = job.report.skip_rows = 0
        job.report.m = t.domain_size()
        return job.report

    # ----- cleanup, checks ----------------------------------------------------------------------
    def uninstall(self) -> None:
        """Drop the rank table (its index and fingerprint go with it), the runs table, and the
        shadow, delta and skip tables. A rank table prepare() did not build (no fingerprint) is
        refused and nothing is dropped."""
        t = self.t
        with self.driver.transaction():
            stored = self.lookup(full=False)[0]
            if self.exists():
                if stored is None or not str(stored).startswith(FINGERPRINT_TAG + " "):
                    raise RankTableMismatchError(
                        f"{t.where}: the table {t.rank_table!r} was not built by prepare() "
                        "(no fingerprint): uninstall() leaves it alone"
                    )
                n = self.names
                for name in (self.runs, n.shadow, n.delta, n.skip, self.ranks):
                    self.driver.execute(f"DROP TABLE IF EXISTS {name}")
        self.seen_prepared = False
        self.proven_oid = None
        self._delta_tables_seen = False
        self._delta_sizes = None
        self._delta_cache = None

    def differs(self) -> bool:
        """Whether the copy (with its delta, if one is pending) and the table differ: one scan
        of each, joined on (id, score)."""
        t = self.t
        opened = self.open(strict=True)
        reads = None if opened is None else opened.reads
        current = self.ranks if not isinstance(reads, DeltaReads) else reads.delta.relation()
        c = self.names.collate
        unmatched, live, ranked = self.driver.one(
            f"SELECT count(*) FILTER (WHERE r.id IS NULL), (SELECT count(*) FROM {t.source}), "
            f"(SELECT count(*) FROM {current}) FROM {t.source} AS b "
            f"LEFT JOIN {current} AS r ON r.id{c} = b.{t.id_sql}{c} "
            f"AND r.score = b.{t.score_sql}::DOUBLE"
        )
        return bool(unmatched or live != ranked)

    def is_stale(self) -> bool:
        """Whether the table's counts differ from the copy (True without one, or with one that
        does not belong to this table): one full scan of the table, joined on (id, score)."""
        if not self.exists():
            return True
        try:
            return self.differs()
        except RankTableMismatchError:
            return True

    def check(self) -> AccessCheck:
        """How sorted access and random access will be served, before a run."""
        t = self.t
        ranked, indexed, with_runs = self.catalog()
        if not ranked or not t.frozen:
            if not ranked:
                now = f"no rank table {t.rank_table!r}: a full scan of {t.where} per read; "
                now += "call prepare()"
            else:  # no cheap proof that the copy is current: runs read the table
                now = (
                    f"{t.where} as it is now, read whole by one query (the in-store one-shot); "
                    f"the copy {t.rank_table!r} serves runs of a frozen table only "
                    "(frozen=True; the command line's --frozen)"
                )
            return AccessCheck(
                t.where,
                [
                    AccessPath("sorted", True, now),
                    AccessPath("random by rank", True, now),
                    AccessPath("random by id", True, "hash join over the id column"),
                ],
            )
        by_rank = f"rank lookup in {t.rank_table!r}: " + (
            "ART index for short batches, a scan of the rank column for long ones"
            if indexed
            else "a scan of the rank column per batch (no index on rank: run prepare() again)"
        )
        by_rank += (
            f"; scores of tied runs from {t.runs_table!r}"
            if with_runs
            else " (no runs table: run prepare() again)"
        )
        return AccessCheck(
            t.where,
            [
                AccessPath("sorted", False, f"rank range on rank-ordered {t.rank_table!r}"),
                AccessPath("random by rank", False, by_rank),
                AccessPath(
                    "random by id",
                    True,
                    f"hash join over the id column of {t.rank_table!r} (one scan per batch; "
                    "the threshold algorithm does not use it)",
                ),
            ],
        )


class _Fold(Exception):
    """A refresh found too much changed: its transaction is rolled back, the copy rebuilt."""


__all__ = ["DuckDBCopy", "Gone"]
