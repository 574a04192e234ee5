"""SQLLedgerStore: the privacy ledger's two tables in any database SQLAlchemy speaks to.

The store behind `PrivacyLedger(url_or_engine)` (topk_middleware/ledger.py keeps the budget
logic: composition, the refusal, the recipes of stored costs; this module only keeps rows).
PostgreSQL (psycopg), SQLite and DuckDB (duckdb-engine) share one schema:

    topk_ledger_principals(principal TEXT PRIMARY KEY, epsilon FLOAT, delta FLOAT,
                           charges INTEGER)  -- the total allowed, and how many charges so far
    topk_ledger_charges(principal TEXT, seq INTEGER, charged_at TIMESTAMP, mechanism TEXT,
                        cost TEXT (JSON), epsilon_after FLOAT, delta_after FLOAT, rule TEXT,
                        released_at TIMESTAMP NULL, guarantee TEXT NULL (JSON),
                        source TEXT NULL, diagnostics TEXT NULL (JSON),
                        PRIMARY KEY (principal, seq))
    topk_ledger_keys(principal TEXT, release_key TEXT, fingerprint TEXT, noise_key TEXT,
                     seq INTEGER NULL, claimed_at TIMESTAMP, release TEXT NULL (JSON),
                     released_at TIMESTAMP NULL, PRIMARY KEY (principal, release_key))
                     -- idempotent releases (topk_middleware/release_keys.py): the charge a key
                     -- paid, its noise key and its one stored release; operator-side only
    topk_ledger_windows(principal TEXT PRIMARY KEY, window_name TEXT)
                     -- a principal granted per calendar window ("hour", "day", "week"): only
                     -- its charges since the current window's start count against the total

A charge is one transaction that locks the principal's row (PostgreSQL `SELECT ... FOR UPDATE`;
SQLite `BEGIN IMMEDIATE`, one writer at a time; DuckDB: every charge updates the principal's row,
so concurrent charges conflict and are retried), reads the principal's window and every cost
charged so far, asks the ledger's `decide` whether the new ones still fit, and inserts them only
then (several costs, such as a trending stream's selection and its next gate, go in one
transaction: one commit). So threads and processes sharing a ledger never overspend it, and a
process killed after the charge leaves it charged. DuckDB allows one writing process per
database file: share a DuckDB ledger between threads, or use PostgreSQL / SQLite for several
processes. A new SQLite or DuckDB ledger file is created readable by its owner only (0600); a
SQLite ledger file is kept in write-ahead-log mode (adapters/ledger_files.py).

Statements: a charge on PostgreSQL is BEGIN, the principal's row locked (with its window), its
keys and stored costs in one read, one write (the principal's count, a multi-row insert of its
new keys, an update of its claimed keys, a multi-row insert of its charges, in one WITH
statement), COMMIT; SQLite and DuckDB read the row and the keys in one statement, the costs in
another, and run the four writes one by one. A read of one statement (a stream's keys, a total)
runs outside any transaction (`one_read`).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import random
import time
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from topk_middleware.accounting import ComposedGuarantee
from topk_middleware.release_keys import Charged, ChargeEntry, key_conflict

from .ledger_files import (
    create_private,
    duckdb_turns,
    immediate_transactions,
    ledger_file,
    one_read,
    owner_only,
)
from .ledger_schema import CHARGES, KEYS, PRINCIPALS, WINDOWS, ledger_tables

DUCKDB_RETRIES = 200
_JITTER = random.SystemRandom()  # the retries' pauses (no noise is drawn from it)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(tzinfo=None)


class SQLLedgerStore:
    """The ledger's tables through SQLAlchemy: a URL (made into an engine) or an engine."""

    def __init__(self, url_or_engine: str | sa.URL | sa.Engine) -> None:
        if isinstance(url_or_engine, sa.Engine):
            url = url_or_engine.url
            engine = url_or_engine if url.get_backend_name() != "sqlite" else None
        else:
            url = sa.make_url(url_or_engine)
            engine = None
        self.dialect = url.get_backend_name()
        self._file = ledger_file(url)
        if self._file is not None:
            create_private(self._file, self.dialect)
        if engine is None:
            kwargs: dict[str, Any] = {}
            if self.dialect == "sqlite":
                kwargs["connect_args"] = {"timeout": 60, "check_same_thread": False}
            engine = sa.create_engine(url, **kwargs)
            if self.dialect == "sqlite":
                immediate_transactions(engine, wal=self._file is not None)
            # an engine of its own: its pooled connections are closed when the store goes
            self._dispose = weakref.finalize(self, engine.dispose)
        else:
            self._dispose = weakref.finalize(self, lambda: None)  # the caller's engine: theirs
        self.engine = engine
        # DuckDB fails a transaction that conflicts at commit instead of waiting: this process's
        # writers to one ledger take turns, and only other processes' writes cause a retry.
        self._turns = duckdb_turns(str(self._file or url)) if self.dialect == "duckdb" else None
        meta = sa.MetaData()
        self.principals, self.charges, self.keys, self.windows = ledger_tables(meta)
        self._retry(lambda conn: meta.create_all(conn, checkfirst=True))

    def close(self) -> None:
        """Close the connections of the engine this store made from a URL (a given engine is
        left to its owner). The store also does so when it is garbage collected."""
        self._dispose()

    # ----- transactions --------------------------------------------------------------------
    def _retry(self, work: Callable[[sa.Connection], Any]) -> Any:
        """Run `work(conn)` in one transaction; on DuckDB retry it after a write conflict (DuckDB
        detects conflicts at commit and does not wait for locks), after a random pause of up to
        2^attempt ms, at most 50 ms, so that contending writers do not collide again at once."""
        for attempt in range(DUCKDB_RETRIES):
            try:
                with self._turns or contextlib.nullcontext(), self.engine.begin() as conn:
                    done = work(conn)
                if self._file is not None and self.dialect == "duckdb":
                    owner_only(Path(f"{self._file}.wal"))
                return done
            except sa.exc.DBAPIError as error:
                conflict = "conflict" in str(error).lower() or "already exists" in str(error)
                if self.dialect != "duckdb" or not conflict or attempt == DUCKDB_RETRIES - 1:
                    raise
                # exponential backoff with full jitter: contending writers spread out
                time.sleep(_JITTER.uniform(0.0, min(0.05, 0.001 * 2.0**attempt)))
        raise AssertionError("unreachable")

    def _costs(
        self, conn: sa.Connection, principal: str, since: dt.datetime | None = None
    ) -> list[str]:
        c = self.charges.c
        query = sa.select(c.cost).where(c.principal == principal)
        if since is not None:
            query = query.where(c.charged_at >= since)
        return [r.cost for r in conn.execute(query.order_by(c.seq))]

    # ----- the LedgerStore interface (topk_middleware/ledger.py) ----------------------------
    def create_principal(
        self, principal: str, epsilon: float, delta: float, window: str | None = None
    ) -> tuple[float, float]:
        p = self.principals

        def create(conn: sa.Connection) -> tuple[float, float]:
            row = conn.execute(
                sa.select(p.c.epsilon, p.c.delta).where(p.c.principal == principal)
            ).first()
            if row is None:
                conn.execute(
                    p.insert().values(principal=principal, epsilon=epsilon, delta=delta, charges=0)
                )
                if window is not None:  # with the total, in its transaction: fixed like it
                    conn.execute(
                        self.windows.insert().values(principal=principal, window_name=window)
                    )
                return epsilon, delta
            return float(row.epsilon), float(row.delta)

        try:
            return self._retry(create)
        except sa.exc.IntegrityError:  # created concurrently: read what was stored
            return self._retry(create)

    def window(self, principal: str) -> str | None:
        w = self.windows
        with one_read(self.engine, self.dialect) as conn:
            return conn.execute(
                sa.select(w.c.window_name).where(w.c.principal == principal)
            ).scalar_one_or_none()

    def total(self, principal: str) -> tuple[float, float] | None:
        p = self.principals
        with one_read(self.engine, self.dialect) as conn:
            row = conn.execute(
                sa.select(p.c.epsilon, p.c.delta).where(p.c.principal == principal)
            ).first()
        return None if row is None else (float(row.epsilon), float(row.delta))

    def _locked(
        self, conn: sa.Connection, principal: str, names: Sequence[str], costs: bool = False
    ) -> tuple[Any, dict[str, Any], list[str] | None]:
        """The principal's row (total, charge count, window) taken first, with the keys of
        `names` that exist and, with `costs` and no window, every cost charged: (the row or
        None, {key: its row}, the costs in order or None: not read). SQLite (BEGIN IMMEDIATE)
        and DuckDB (the charge's update of the row) serialise writers by their transaction: one
        statement, the keys left-joined to the row. PostgreSQL locks the row (FOR UPDATE OF it)
        in a statement of its own, and reads the keys and costs in one more, begun after the
        lock: under READ COMMITTED each statement takes its own snapshot, and the locking
        statement's view of other tables predates the charge it waited for. Cost: 1 statement
        (2 on PostgreSQL)."""
        p, w, k = self.principals, self.windows, self.keys
        head = sa.select(p.c.epsilon, p.c.delta, p.c.charges, w.c.window_name).where(
            p.c.principal == principal
        )
        joined = p.outerjoin(w, w.c.principal == p.c.principal)
        keyed = (k.c.principal == principal) & k.c.release_key.in_(list(names))
        if self.dialect != "postgresql":
            if names:
                joined = joined.outerjoin(k, keyed & (k.c.principal == p.c.principal))
                head = head.add_columns(
                    k.c.release_key, k.c.fingerprint, k.c.noise_key, k.c.seq, k.c.release
                )
            rows = conn.execute(head.select_from(joined)).all()
            found = {r.release_key: r for r in rows if names and r.release_key is not None}
            return (rows[0] if rows else None), found, None
        row = conn.execute(head.select_from(joined).with_for_update(of=p)).first()
        prefetch = costs and row is not None and row.window_name is None
        if row is None or not (names or prefetch):
            return row, {}, None
        parts = []
        if names:
            parts.append(
                sa.select(
                    sa.literal_column("0").label("part"), k.c.release_key, k.c.fingerprint,
                    k.c.noise_key, k.c.seq, k.c.release, sa.null().label("cost"),
                ).where(keyed)
            )  # fmt: skip
        if prefetch:
            c = self.charges.c
            nothing = [sa.null().label(name) for name in ("k", "f", "n")]
            parts.append(
                sa.select(
                    sa.literal_column("1").label("part"), *nothing, c.seq.label("seq"),
                    sa.null().label("r"), c.cost.label("cost"),
                ).where(c.principal == principal)
            )  # fmt: skip
        query = parts[0] if len(parts) == 1 else sa.union_all(*parts)
        rows = conn.execute(query.order_by(sa.literal_column("part"), sa.literal_column("seq")))
        found, stored = {}, []
        for r in rows:
            if r.part == 0:
                found[r.release_key] = r
            else:
                stored.append(r.cost)
        return row, found, (stored if prefetch else None)

    def append_charges(
        self,
        principal: str,
        entries: Sequence[ChargeEntry],
        decide: Callable[..., ComposedGuarantee],
        claim: bool = False,
        unless_stored: str | None = None,
        claims: Sequence[tuple[str, str, str, str]] = (),
    ) -> Charged:
        """The LedgerStore's charge (topk_middleware/ledger.py): one transaction holding the
        principal's row locked (every dialect writes it; PostgreSQL locks it FOR UPDATE first),
        read with its window, the keys it names and its costs (`_locked`); each keyed
        entry checked (and, with `claim`, claimed) and `claims` made before decide() sees the
        stored costs and the new ones; the keys new to the ledger inserted in one statement
        (a charged entry's with its charge number), the claimed ones given theirs in one, the
        charges in one. Statements (PostgreSQL): the lock, the keys and costs, and the writes
        (count, new keys, claimed keys, charges) as one (`_write`); a principal with a window
        has its costs read apart."""
        p = self.principals
        names = [e.key for e in entries if e.key is not None] + [c[0] for c in claims]
        names += [unless_stored] if unless_stored is not None else []

        def work(conn: sa.Connection) -> Charged:
            row, found, stored_costs = self._locked(conn, principal, names, costs=True)
            if row is None:
                raise KeyError(f"principal {principal!r} has no budget in this ledger")
            stored = found.get(unless_stored)
            if stored is not None and stored.release is not None:  # answered meanwhile
                return Charged([], None, str(stored.release), {})
            noise_keys, now = {}, _now()
            new: dict[str, dict[str, Any]] = {}  # keys to insert, by name
            for key, fingerprint, noise_key, release in claims:
                held = found.get(key)
                if held is None:
                    new[key] = self._key_row(principal, key, fingerprint, noise_key, now, release)
                elif held.fingerprint != fingerprint:
                    raise key_conflict(principal, key)
                noise_keys[key] = noise_key if held is None else str(held.noise_key)
            seqs: list[int | None] = []
            reclaimed: dict[str, ChargeEntry] = {}  # claimed keys the entries charge
            for entry in entries:
                if entry.key is None:
                    seqs.append(None)
                    continue
                if any(entry.key == e.key for e in entries[: len(seqs)]):
                    raise ValueError(f"release key {entry.key!r} is charged twice in one charge")
                paid, fresh = self._key_paid(principal, entry, found.get(entry.key), claim)
                seqs.append(paid)
                if fresh:
                    new[entry.key] = self._key_row(
                        principal, entry.key, str(entry.fingerprint), entry.noise_key, now
                    )
                elif paid is None:
                    reclaimed[entry.key] = entry
            due = [e for e, seq in zip(entries, seqs, strict=True) if seq is None]
            if not due:
                self._write(conn, self._insert_keys(list(new.values())))
                return Charged(
                    [int(seq) for seq in seqs if seq is not None], None, None, noise_keys
                )
            after = decide(
                float(row.epsilon),
                float(row.delta),
                row.window_name,
                lambda since: (
                    stored_costs
                    if since is None and stored_costs is not None
                    else self._costs(conn, principal, since)
                ),
                [e.cost for e in due],
            )
            count = p.update().where(p.c.principal == principal)
            writes = [count.values(charges=p.c.charges + len(due))]
            seq, rows, numbered = int(row.charges), [], {}
            for i, entry in enumerate(entries):
                if seqs[i] is None:
                    seq += 1
                    seqs[i] = seq
                    rows.append({"seq": seq, "mechanism": entry.mechanism, "cost": entry.cost})
                    if entry.key is not None:
                        numbered[entry.key] = seq
            for key, row_of_key in new.items():
                row_of_key["seq"] = numbered.get(key)
            writes += self._insert_keys(list(new.values()))
            if reclaimed:
                writes.append(self._number_keys(principal, reclaimed, numbered, found))
            composed = {"epsilon_after": after.epsilon, "delta_after": after.delta}
            values = [
                {"principal": principal, "charged_at": now, "rule": after.rule, **composed, **r}
                for r in rows
            ]
            self._write(conn, [*writes, self.charges.insert().values(values)])
            return Charged([int(s) for s in seqs if s is not None], after, None, noise_keys)

        return self._retry(work)

    @staticmethod
    def _key_row(
        principal: str, key: str, fingerprint: str, noise_key: str, now: dt.datetime,
        release: str | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        """A new key's row (its charge number, `seq`, filled in by the charge)."""
        return {
            "principal": principal,
            "release_key": key,
            "fingerprint": fingerprint,
            "noise_key": noise_key,
            "seq": None,
            "claimed_at": now,
            "release": release,
            "released_at": None if release is None else now,
        }

    def _write(self, conn: sa.Connection, statements: list[Any]) -> None:
        """Run the writes in order; on PostgreSQL as one statement, the others data-modifying
        WITH clauses of the last (one round trip: they write different rows and read nothing
        another writes; all see the statement's snapshot, taken after the charge's lock)."""
        if self.dialect == "postgresql" and len(statements) > 1:
            last = statements[-1]
            for i, statement in enumerate(statements[:-1]):
                last = last.add_cte(statement.cte(f"topk_write_{i}"))
            statements = [last]
        for statement in statements:
            conn.execute(statement)

    def _insert_keys(self, rows: list[dict[str, Any]]) -> list[Any]:
        """The rows (`_key_row`) in one INSERT of several VALUES (none: no statement)."""
        return [self.keys.insert().values(rows)] if rows else []

    def _number_keys(
        self,
        principal: str,
        entries: dict[str, ChargeEntry],
        numbered: dict[str, int],
        found: dict[str, Any],
    ) -> Any:
        """One UPDATE giving each claimed key its charge number and, where the entry reclaims
        it (another fingerprint: `_key_paid` allowed it), the entry's fingerprint and noise key;
        the values chosen per key by CASE, all of them bound parameters."""
        k = self.keys.c
        again = {key: e for key, e in entries.items() if e.fingerprint != found[key].fingerprint}

        def per_key(values: dict[str, Any], column: Any) -> Any:
            return sa.case(values, value=k.release_key, else_=column) if values else column

        fingerprints = {key: e.fingerprint for key, e in again.items()}
        return (
            self.keys.update()
            .where((k.principal == principal) & k.release_key.in_(list(entries)))
            .values(
                seq=per_key({key: numbered[key] for key in entries}, k.seq),
                fingerprint=per_key(fingerprints, k.fingerprint),
                noise_key=per_key({key: e.noise_key for key, e in again.items()}, k.noise_key),
            )
        )

    def _insert_key(
        self, conn: sa.Connection, principal: str, key: str, fingerprint: Any, noise_key: str,
        release: str | None = None,
    ) -> None:  # fmt: skip
        row = self._key_row(principal, key, fingerprint, noise_key, _now(), release)
        self._write(conn, self._insert_keys([row]))

    def _key_paid(
        self, principal: str, entry: ChargeEntry, held: Any, claim: bool
    ) -> tuple[int | None, bool]:
        """(the charge number of the entry's key (its row `held`, or None) if it is charged
        already (nothing more to pay), else None; whether the key is new and must be inserted).
        ReleaseKeyConflict if it holds another fingerprint; with `claim`, a key absent (or
        claimed, never charged nor answered) is claimed with the entry's."""
        if held is None:
            if not claim:
                raise KeyError(f"release key {entry.key!r} was not claimed")
            return None, True
        if held.fingerprint != entry.fingerprint:
            unused = held.seq is None and held.release is None
            if not (claim and unused):  # reclaimed with other parameters meanwhile
                raise key_conflict(principal, str(entry.key))
            return None, False
        return (None if held.seq is None else int(held.seq)), False

    def claim_key(
        self, principal: str, release_key: str, fingerprint: str, noise_key: str
    ) -> tuple[str, str, int | None, str | None]:
        k = self.keys.c
        keyed = (k.principal == principal) & (k.release_key == release_key)

        def claim(conn: sa.Connection) -> tuple[str, str, int | None, str | None]:
            query = sa.select(k.fingerprint, k.noise_key, k.seq, k.release).where(keyed)
            row = conn.execute(query).first()
            unused = row is not None and row.seq is None and row.release is None
            if unused and row.fingerprint != fingerprint:
                # claimed, never charged or answered: the call that claimed it released nothing
                conn.execute(
                    self.keys.update()
                    .where(keyed & k.seq.is_(None) & k.release.is_(None))
                    .values(fingerprint=fingerprint, noise_key=noise_key, claimed_at=_now())
                )
                row = conn.execute(query).first()
            if row is None:
                self._insert_key(conn, principal, release_key, fingerprint, noise_key)
                return fingerprint, noise_key, None, None
            return row.fingerprint, row.noise_key, row.seq, row.release

        try:
            return self._retry(claim)
        except sa.exc.IntegrityError:  # claimed concurrently: read what was stored
            return self._retry(claim)

    def lookup_key(
        self, principal: str, release_key: str
    ) -> tuple[str, str, int | None, str | None] | None:
        return self.lookup_keys(principal, [release_key]).get(release_key)

    def lookup_keys(
        self, principal: str, release_keys: Sequence[str]
    ) -> dict[str, tuple[str, str, int | None, str | None]]:
        k = self.keys.c
        with one_read(self.engine, self.dialect) as conn:
            rows = conn.execute(
                sa.select(k.release_key, k.fingerprint, k.noise_key, k.seq, k.release).where(
                    (k.principal == principal) & k.release_key.in_(list(release_keys))
                )
            ).all()
        return {r.release_key: (r.fingerprint, r.noise_key, r.seq, r.release) for r in rows}

    def store_release(
        self, principal: str, release_key: str, fingerprint: str, release: str
    ) -> str:
        k = self.keys.c
        keyed = (
            (k.principal == principal)
            & (k.release_key == release_key)
            & (k.fingerprint == fingerprint)
        )

        returning = self.dialect in ("postgresql", "sqlite")  # UPDATE ... RETURNING

        def store(conn: sa.Connection) -> str:
            update = (
                self.keys.update()
                .where(keyed & k.release.is_(None))
                .values(release=release, released_at=_now())
            )
            if returning and conn.execute(update.returning(k.release)).first() is not None:
                return release  # ours: stored by this statement
            if not returning:
                conn.execute(update)
            stored = conn.execute(sa.select(k.release).where(keyed)).first()
            if stored is None:  # reclaimed with other parameters meanwhile
                raise key_conflict(principal, release_key)
            return stored.release

        return self._retry(store)

    def store_keyed(
        self,
        principal: str,
        release_key: str,
        fingerprint: str,
        release: str,
        unless_charged: str | None = None,
        completions: Sequence[tuple[int, str, str, str]] = (),
        noise_key: str = "",
    ) -> str | None:
        k = self.keys.c
        keyed = (k.principal == principal) & (k.release_key == release_key)
        names = [release_key] + ([unless_charged] if unless_charged is not None else [])

        def store(conn: sa.Connection) -> str | None:
            row = None
            if unless_charged is not None:  # locked as a charge locks it, keys read with it
                row, found, _ = self._locked(conn, principal, names)
            if row is None:
                found = {
                    r.release_key: r
                    for r in conn.execute(
                        sa.select(k.release_key, k.fingerprint, k.seq, k.release).where(
                            (k.principal == principal) & k.release_key.in_(names)
                        )
                    )
                }
            paid = found.get(unless_charged)
            if paid is not None and paid.seq is not None:
                return None
            held = found.get(release_key)
            if held is None:
                self._insert_key(conn, principal, release_key, fingerprint, noise_key, release)
            elif held.fingerprint != fingerprint:
                raise key_conflict(principal, release_key)
            elif held.release is not None:
                return str(held.release)
            else:
                conn.execute(
                    self.keys.update().where(keyed).values(release=release, released_at=_now())
                )
            for seq, guarantee, source, diagnostics in completions:
                self._complete(conn, principal, seq, guarantee, source, diagnostics)
            return release

        try:
            return self._retry(store)
        except sa.exc.IntegrityError:  # stored concurrently: read what was stored
            return self._retry(store)

    def complete_charge(
        self, principal: str, seq: int, guarantee: str, source: str, diagnostics: str
    ) -> None:
        self._retry(
            lambda conn: self._complete(conn, principal, seq, guarantee, source, diagnostics)
        )

    def _complete(
        self,
        conn: sa.Connection,
        principal: str,
        seq: int,
        guarantee: str,
        source: str,
        diagnostics: str,
    ) -> None:
        c = self.charges.c
        conn.execute(
            self.charges.update()
            .where((c.principal == principal) & (c.seq == seq))
            .values(released_at=_now(), guarantee=guarantee, source=source, diagnostics=diagnostics)
        )

    def charged_costs(
        self, principal: str, since: dt.datetime | None = None
    ) -> tuple[float, list[str]]:
        def work(conn: sa.Connection) -> tuple[float, list[str]]:
            row = conn.execute(
                sa.select(self.principals.c.delta).where(self.principals.c.principal == principal)
            ).first()
            if row is None:
                raise KeyError(f"principal {principal!r} has no budget in this ledger")
            return float(row.delta), self._costs(conn, principal, since)

        return self._retry(work)

    def charge_rows(self, principal: str) -> list[dict[str, Any]]:
        with one_read(self.engine, self.dialect) as conn:
            rows = conn.execute(
                sa.select(self.charges)
                .where(self.charges.c.principal == principal)
                .order_by(self.charges.c.seq)
            )
            return [dict(r._mapping) for r in rows]


__all__ = ["CHARGES", "KEYS", "PRINCIPALS", "WINDOWS", "SQLLedgerStore"]
