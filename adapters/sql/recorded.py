"""The copy of SQLAlchemyTable's layout: tables under fixed names declared with the table's own
types, the copy's record kept in tables the copies of a schema share (docs/freshness.md).

`RecordedCopy` is a `NamedCopy` (copies.py) whose
* rank table (rank primary key, an index on id) and runs table (first_rank primary key) are
  declared with the id's and score's own types (text ids in byte order), filled by INSERT ..
  SELECT in the build's transaction and checked again before it commits;
* fingerprint is a *mark* in the table topk_rank_fingerprints (one row per copy): a hash of the
  catalog identity of the table (of the votes and items tables where the counts are counted
  from votes) and of the copy (the dialect's `identity_fact_sql`), written in
  the transaction that fills the copy; a copy without one was not built by prepare() and is
  refused, one whose mark differs was built from an earlier table of that name;
* freshness stamp is a row of topk_write_stamps (the stamp of freshness.WriteLog or RowStamps);
* indexes on the table of counts itself, (score DESC, id) and (id), are made by prepare() where
  asked (`index_source`) and dropped by uninstall().

A run without a copy is refused (RuntimeError: call prepare() first). A refresh of a filled
copy fills it again in one transaction, or, where the dialect says so (`refresh_beside`:
a store whose deleted rows stay behind as dead rows), builds new tables beside it and swaps
them in (NamedCopy), their primary keys and indexes renamed to the old ones' names. Where a
table's catalog facts are no lasting identity (a table made again the same way may keep
them), prepare() keeps a copy whose mark matches only if the catalog did not change since this
object last looked (`catalog_version_sql`) or the copy holds the table's rows. A prepare() that
fails undoes what it made where no copy existed before it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from adapters._sql import FINGERPRINT_TAG, RankTableMismatchError

from .copies import CopyNames, NamedCopy
from .engine import Run

FINGERPRINTS_TABLE = "topk_rank_fingerprints"
STAMPS_TABLE = "topk_write_stamps"


@dataclass(frozen=True)
class RecordedNames(CopyNames):
    """CopyNames, and the constraint and index names the layout declares."""

    rank_key: str = ""  # the rank table's primary key constraint
    runs_key: str = ""  # the runs table's
    beside_keys: tuple[str, str] = ("", "")  # a refresh's primary keys
    source_indexes: tuple[tuple[str, str], ...] = ()  # (name, columns SQL) on the table
    record: str | None = None  # the copy's comment (from_votes' record), if any
    identity: tuple[str, ...] = ()  # the relations the mark names beside the copy (else the table)


def mark_of(facts: list[Any]) -> int:
    """The mark of a copy: a signed 64-bit hash of the tag and the catalog facts."""
    text = "\x00".join([FINGERPRINT_TAG, *("" if f is None else str(f) for f in facts)])
    return int.from_bytes(hashlib.sha1(text.encode("utf-8")).digest()[:8], "big", signed=True)


class RecordedCopy(NamedCopy):
    """The layout of module docstring; `names` RecordedNames."""

    names: RecordedNames

    @property
    def reads_around(self) -> bool:
        """Whether the proof keeps a change log (around.py): its stamp line then follows the
        write log's in the copy's row of topk_write_stamps."""
        return self.t.proof.changes is not None

    def __init__(self, t: Any, names: RecordedNames, *, index_source: bool = True) -> None:
        super().__init__(t, names)
        q = self.d.qualified
        self.prints = q(names.namespace, FINGERPRINTS_TABLE)
        self.stamps = q(names.namespace, STAMPS_TABLE)
        self.index_source = index_source
        self._version: Any = None  # the catalog version this object last saw the copy at

    # ----- the record ---------------------------------------------------------------------------
    def _facts_sql(self) -> list[str]:
        named = self.names.identity or (self.t.source,)
        return [self.d.identity_fact_sql(r) for r in (*named, self.ranks)]

    def _stored_sql(self) -> str:
        name = self.d.literal(self.names.ranks)
        return f"(SELECT mark FROM {self.prints} WHERE rank_table = {name})"

    def _stored_stamp_sql(self) -> str:
        name = self.d.literal(self.names.ranks)
        return f"(SELECT stamp FROM {self.stamps} WHERE rank_table = {name})"

    def stamp_sql(self) -> str:
        """SQL of the proof's stamp (the first line of the stored one, which holds the change
        log's line after it where the proof keeps one)."""
        stored = self._stored_stamp_sql()
        return self.d.text_line_sql(stored, 1) if self.reads_around else stored

    def _tables(self) -> tuple[bool, bool, bool, bool, bool]:
        """Whether the rank table, the runs table, the proof's log, the fingerprints table and
        the stamps table exist (one lookup)."""
        e = self.d.exists_sql
        row = self.t.driver.one(
            f"SELECT {e(self.ranks)}, {e(self.runs)}, {self.t.proof.exists_sql()}, "
            f"{e(self.prints)}, {e(self.stamps)}"
        )
        return tuple(bool(x) for x in row)  # type: ignore[return-value]

    def _belongs(self, stored: Any, facts: list[Any], strict: bool) -> bool:
        if stored is None:
            why = "prepare() did not build it (no fingerprint)"
        elif int(stored) != mark_of(facts):
            if not strict:
                return False
            why = "it was built from an earlier table of this name, or the table was re-created"
        else:
            return True
        raise RankTableMismatchError(
            f"{self.t.where}: the rank table {self.names.ranks!r} does not belong to this table "
            f"({why}): call prepare(refresh=True)"
        )

    # ----- a run -----------------------------------------------------------------------------
    def open(self, strict: bool, runs: bool = True) -> Run | None:
        """m (the first and last ranks, two probes of the primary key), the mark and the facts,
        the number of runs of tied scores and the proof: one query."""
        t = self.t
        ranked, with_runs, logged, printed, stamped = self._tables()
        if not ranked:
            raise RuntimeError(
                f"rank table {self.names.ranks!r} of {t.where} does not exist: call prepare() first"
            )
        facts = self._facts_sql()
        columns = [
            f"(SELECT rank FROM {self.ranks} ORDER BY rank LIMIT 1)",
            f"(SELECT rank FROM {self.ranks} ORDER BY rank DESC LIMIT 1)",
            self._stored_sql() if printed else "NULL",
            *facts,
            f"(SELECT run + 1 FROM {self.runs} ORDER BY first_rank DESC LIMIT 1)"
            if with_runs and runs
            else "NULL",
            t.proof.proof_sql(self, logged and stamped),
        ]
        if self.reads_around:
            columns.append(self._stored_stamp_sql() if stamped else "NULL")
        row = t.driver.one(f"SELECT {', '.join(columns)}")
        low, high, stored = row[:3]
        count, proven = row[3 + len(facts)], row[4 + len(facts)]
        if high is None:
            raise RuntimeError(
                f"rank table {self.names.ranks!r} of {t.where} is empty: call prepare() first"
            )
        if low != 0:
            raise RuntimeError(f"rank table {self.names.ranks!r} does not start at rank 0")
        why = (
            None
            if self._belongs(stored, list(row[3 : 3 + len(facts)]), strict)
            else ("another table")
        )
        # the record as a comment would hold it: the fingerprint line (unused), the stamps
        stamp = None if not self.reads_around or row[-1] is None else "\n" + str(row[-1])
        if why is None and proven is None:
            why = "written" if logged and stamped else "unproven"
        return Run(
            "copy",
            int(high) + 1,
            self.ranks,
            self.runs if count is not None else None,
            None if count is None else int(count),
            record=stamp,
            why=why,
        )

    # ----- prepare ---------------------------------------------------------------------------
    def prepare(self, refresh: bool = False, **options: Any) -> None:
        """Validate the counts and build what runs read (module docstring); idempotent. With
        `refresh` (or a copy not this table's) the copy is rebuilt from the table's current
        state, beside the old one."""
        t = self.t
        had = self.exists()
        try:
            self._prepare(refresh, options)
        except BaseException:
            if not had and not t.driver.lost():
                self.uninstall()  # refused or stopped: what this call made goes again
            raise

    def _prepare(self, refresh: bool, options: dict[str, Any]) -> None:
        t, d = self.t, self.d
        statement_timeout = options.get("statement_timeout", d.prepare_statement_timeout)
        swap_timeout = options.get("swap_timeout", d.swap_timeout)
        if statement_timeout is not None and not statement_timeout > 0:
            raise ValueError(f"statement_timeout must be > 0 seconds, got {statement_timeout}")
        if not swap_timeout > 0:
            raise ValueError(f"swap_timeout must be > 0 seconds, got {swap_timeout}")
        index_source = options.get("index_source", self.index_source)
        with t.driver.session(), d.prepare_lock(t.driver, self.names_key()):
            self._create_shared(self.prints, d.fingerprints_table_sql(self.prints))
            with t.driver.transaction():
                self._create_tables()
                if index_source:
                    for name, columns in self.names.source_indexes:
                        t.driver.execute(d.plain_index_sql(name, t.source, columns))
                filled = t.driver.one(f"SELECT rank FROM {self.ranks} LIMIT 1") is not None
                runs_filled = t.driver.one(f"SELECT run FROM {self.runs} LIMIT 1") is not None
                if filled and runs_filled and not refresh:
                    refresh = not self._trusted()
            with t.driver.transaction():  # committed before the copy's snapshot
                t.proof.install(self)
            if filled and runs_filled and not refresh:
                return
            try:
                with t.driver.transaction(isolation=d.snapshot_isolation):
                    d.limit_statements(t.driver, statement_timeout)
                    if filled and d.refresh_beside:
                        self._fill_beside(float(swap_timeout))
                    else:
                        self._fill(self.ranks, self.runs)
                    self._stamp()
            except t.driver.errors as error:
                if not d.canceled(t.driver, error):
                    raise
                raise TimeoutError(
                    f"{t.where}: prepare() was stopped by its statement_timeout of "
                    f"{statement_timeout} s; nothing was changed"
                ) from None
        for table in (self.ranks, self.runs):
            d.analyze(t.driver, table)
        self._version = self._catalog_version()

    def names_key(self) -> str:
        """The text the copy's session lock is keyed by (its qualified name as the constructor
        spells it)."""
        return str(self.t.proof.key_name)

    def _create_shared(self, table: str, statement: str) -> None:
        """A table the copies of several tables share, made where missing in a transaction of
        its own: of two prepares making it at once, the one that loses the race finds it."""
        t = self.t
        try:
            with t.driver.transaction():
                t.driver.execute(statement)
        except t.driver.errors:
            if not t.driver.scalar(f"SELECT {self.d.exists_sql(table)}"):
                raise

    def _create_tables(self) -> None:
        """The rank and runs tables where missing; an existing table of one of these names must
        have their columns."""
        t, d, n = self.t, self.d, self.names
        for name, kind, statements in (
            (n.ranks, "rank", self._rank_ddl(self.ranks, n.rank_key, n.id_index)),
            (n.runs, "runs", self._runs_ddl(self.runs, n.runs_key)),
        ):
            have = d.columns(t.driver, n.namespace, name)
            if have is None:
                for statement in statements:
                    t.driver.execute(statement)
                continue
            want = {"rank", "id", "score"} if kind == "rank" else {"run", "first_rank", "score"}
            if set(have) != want:
                raise ValueError(
                    f"{kind} table {name!r} exists with columns {sorted(have)}, not "
                    f"({', '.join(sorted(want))}): drop it or pass another rank_table name"
                )

    def _rank_ddl(self, target: str, key: str, index: str) -> list[str]:
        t, d = self.t, self.d
        create = d.declared_table_sql(
            target,
            [
                ("rank", "BIGINT"),
                ("id", d.id_copy_type(t.id_info)),
                ("score", d.score_copy_type(t.score_info)),
            ],
            "rank",
            key,
        )
        record = self.names.record
        made = [create] if record is None else d.commented_table_sql(create, target, record)
        return [*made, d.plain_index_sql(index, target, d.quote("id"))]

    def _runs_ddl(self, target: str, key: str) -> list[str]:
        d = self.d
        columns = [
            ("run", "BIGINT"),
            ("first_rank", "BIGINT"),
            ("score", d.score_copy_type(self.t.score_info)),
        ]
        return [d.declared_table_sql(target, columns, "first_rank", key)]

    def _trusted(self) -> bool:
        """prepare() without refresh on a filled copy: keep it (True) or rebuild it (False); a
        copy prepare() did not build is refused."""
        t = self.t
        facts = self._facts_sql()
        printed = t.driver.scalar(f"SELECT {self.d.exists_sql(self.prints)}")
        stored_sql = self._stored_sql() if printed else "NULL"
        stored, *current = t.driver.one(f"SELECT {stored_sql}, {', '.join(facts)}")
        if stored is None:
            raise RankTableMismatchError(
                f"{t.where}: a table named {self.names.ranks!r} exists but prepare() did not "
                "build it (no fingerprint): drop it, pass another rank_table name, or call "
                "prepare(refresh=True) to replace it"
            )
        if int(stored) != mark_of(current):
            return False
        if self.d.catalog_version_sql is None:  # the facts are a lasting identity
            return True
        version = self._catalog_version()
        if version == self._version:  # no table made again since this object looked
            return True
        if self._differs():
            return False
        self._version = version
        return True

    def _catalog_version(self) -> Any:
        sql = self.d.catalog_version_sql
        return None if sql is None else self.t.driver.scalar(sql)

    def _differs(self) -> bool:
        """Whether the table's rows and the copy's differ (one scan of each, joined on id)."""
        t = self.t
        key = t.dialect.byte_order("b.id") if t.text_ids else "b.id"
        live = f"(SELECT {t.id_sql} AS id, {t.score_sql} AS score FROM {t.source})"
        unmatched, rows, ranked = t.driver.one(
            f"SELECT (SELECT count(*) FROM {live} AS b LEFT JOIN {self.ranks} AS r "
            f"ON r.id = {key} AND r.score = b.score WHERE r.rank IS NULL), "
            f"(SELECT count(*) FROM {t.source}), (SELECT count(*) FROM {self.ranks})"
        )
        return bool(unmatched or rows != ranked)

    def _fill(self, ranks: str, runs: str) -> None:
        """Validate, copy, check the copy, inside the caller's transaction."""
        t = self.t
        t.validate()
        t.driver.execute(f"DELETE FROM {ranks}")
        t.driver.execute(
            f"INSERT INTO {ranks} (rank, id, score) {t.canonical_rows(raw_scores=True)}"
        )
        t.driver.execute(f"DELETE FROM {runs}")
        t.driver.execute(self.d.fill_runs_sql(runs, ranks))
        t.check_copy(ranks)

    def _fill_beside(self, swap_timeout: float) -> None:
        """A refresh: new tables beside the old ones, filled and checked, then swapped in, all
        in the caller's transaction (nothing changes unless it commits; no dead rows)."""
        t, d, n = self.t, self.d, self.names
        ranks, runs = (d.qualified(n.namespace, name) for name in n.beside[:2])
        old = {
            "rank": d.index_names(t.driver, self.ranks),
            "runs": d.index_names(t.driver, self.runs),
        }
        for table in (runs, ranks):
            t.driver.execute(d.drop_table(table))  # left by a prepare() that was killed
        for statement in self._rank_ddl(ranks, n.beside_keys[0], n.beside[3]):
            t.driver.execute(statement)
        for statement in self._runs_ddl(runs, n.beside_keys[1]):
            t.driver.execute(statement)
        self._fill(ranks, runs)
        self._swap([ranks, runs], True, swap_timeout, indexes=False)
        renames = [
            (n.beside_keys[0], old["rank"].get(("rank",), n.rank_key)),
            (n.beside[3], old["rank"].get(("id",), n.id_index)),
            (n.beside_keys[1], old["runs"].get(("first_rank",), n.runs_key)),
        ]
        for current, final in renames:
            if current != final:
                t.driver.execute(d.rename_index_sql(d.qualified(n.namespace, current), final))

    def _stamp(self) -> None:
        """The copy's mark and the proof's stamp, in the build's transaction."""
        t, d = self.t, self.d
        facts = t.driver.one(f"SELECT {', '.join(self._facts_sql())}")
        t.driver.execute(
            d.upsert_sql(self.prints, ["rank_table", "mark"]),
            {"rank_table": self.names.ranks, "mark": mark_of(list(facts))},
        )
        lines = t.proof.stamp(self)
        if lines:
            t.driver.execute(
                d.upsert_sql(self.stamps, ["rank_table", "stamp"]),
                {"rank_table": self.names.ranks, "stamp": "\n".join(lines)},
            )
        elif t.driver.scalar(f"SELECT {self.d.exists_sql(self.stamps)}"):  # a proof stamps
            t.driver.execute(  # nothing, where no proof of the schema ever made the table
                f"DELETE FROM {self.stamps} WHERE rank_table = :name", {"name": self.names.ranks}
            )

    # ----- cleanup ----------------------------------------------------------------------------
    def uninstall(self) -> None:
        """Drop the rank and runs tables, this copy's rows of the shared tables (and those
        tables once empty), the proof's objects and the indexes prepare() put on the table. A
        filled rank table with no fingerprint (not built by prepare()) is refused and nothing
        is dropped."""
        t, d, n = self.t, self.d, self.names
        name = {"name": n.ranks}
        with t.driver.transaction():
            ranked, _, _, printed, stamped = self._tables()
            if ranked:
                filled = t.driver.one(f"SELECT rank FROM {self.ranks} LIMIT 1") is not None
                marked = printed and t.driver.one(
                    f"SELECT mark FROM {self.prints} WHERE rank_table = :name", name
                )
                if filled and not marked:
                    raise RankTableMismatchError(
                        f"{t.where}: the table {n.ranks!r} was not built by prepare() (no "
                        "fingerprint): uninstall() leaves it alone"
                    )
            t.driver.execute(d.drop_table(self.runs))
            t.driver.execute(d.drop_table(self.ranks))
            left = 0
            if stamped:
                t.driver.execute(f"DELETE FROM {self.stamps} WHERE rank_table = :name", name)
                left = int(t.driver.scalar(f"SELECT count(*) FROM {self.stamps}"))
            t.proof.uninstall(self, keep_shared=bool(left))
            if not left and not t.proof.users():
                t.driver.execute(d.drop_table(self.stamps))
            if printed:
                t.driver.execute(f"DELETE FROM {self.prints} WHERE rank_table = :name", name)
                if t.driver.one(f"SELECT rank_table FROM {self.prints} LIMIT 1") is None:
                    t.driver.execute(d.drop_table(self.prints))
            if n.source_indexes and t.driver.scalar(f"SELECT {d.exists_sql(t.source)}"):
                for index, _ in n.source_indexes:
                    t.driver.execute(d.drop_index_sql(d.qualified(n.namespace, index), t.source))


__all__ = ["FINGERPRINTS_TABLE", "STAMPS_TABLE", "RecordedCopy", "RecordedNames", "mark_of"]
