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
SQLite ledger file is kept in write-ahead-log mode (`_immediate_transactions`).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import random
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from topk_middleware.accounting import ComposedGuarantee
from topk_middleware.release_keys import Charged, ChargeEntry, key_conflict

PRINCIPALS = "topk_ledger_principals"
CHARGES = "topk_ledger_charges"
KEYS = "topk_ledger_keys"
WINDOWS = "topk_ledger_windows"
DUCKDB_RETRIES = 200
_JITTER = random.SystemRandom()  # the retries' pauses (no noise is drawn from it)


_TURNS: dict[str, threading.Lock] = {}
_TURNS_LOCK = threading.Lock()


def _duckdb_turns(ledger: str) -> threading.Lock:
    """The lock this process's writers to one DuckDB ledger (its file) take turns with."""
    with _TURNS_LOCK:
        return _TURNS.setdefault(ledger, threading.Lock())


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
        self._file = _ledger_file(url)
        if self._file is not None:
            _create_private(self._file, self.dialect)
        if engine is None:
            kwargs: dict[str, Any] = {}
            if self.dialect == "sqlite":
                kwargs["connect_args"] = {"timeout": 60, "check_same_thread": False}
            engine = sa.create_engine(url, **kwargs)
            if self.dialect == "sqlite":
                _immediate_transactions(engine, wal=self._file is not None)
            # an engine of its own: its pooled connections are closed when the store goes
            self._dispose = weakref.finalize(self, engine.dispose)
        else:
            self._dispose = weakref.finalize(self, lambda: None)  # the caller's engine: theirs
        self.engine = engine
        # DuckDB fails a transaction that conflicts at commit instead of waiting: this process's
        # writers to one ledger take turns, and only other processes' writes cause a retry.
        self._turns = _duckdb_turns(str(self._file or url)) if self.dialect == "duckdb" else None
        meta = sa.MetaData()
        self.principals = sa.Table(
            PRINCIPALS,
            meta,
            sa.Column("principal", sa.String, primary_key=True),
            sa.Column("epsilon", sa.Float(53), nullable=False),
            sa.Column("delta", sa.Float(53), nullable=False),
            sa.Column("charges", sa.Integer, nullable=False),
            # a total no budget may have is never stored (NaN compares above every float in
            # PostgreSQL, and SQLite stores it as NULL); topk_middleware/ledger.py refuses one
            # that an older table holds
            sa.CheckConstraint(
                "epsilon > 0 AND epsilon <= 1.7976931348623157e308 AND delta >= 0 AND delta < 1",
                name="topk_ledger_total_is_a_budget",
            ),
        )
        self.charges = sa.Table(
            CHARGES,
            meta,
            sa.Column("principal", sa.String, primary_key=True),
            sa.Column("seq", sa.Integer, primary_key=True),
            sa.Column("charged_at", sa.DateTime, nullable=False),
            sa.Column("mechanism", sa.String, nullable=False),
            sa.Column("cost", sa.Text, nullable=False),
            sa.Column("epsilon_after", sa.Float(53), nullable=False),
            sa.Column("delta_after", sa.Float(53), nullable=False),
            sa.Column("rule", sa.Text, nullable=False),
            sa.Column("released_at", sa.DateTime),
            sa.Column("guarantee", sa.Text),
            sa.Column("source", sa.Text),
            sa.Column("diagnostics", sa.Text),
        )
        self.keys = sa.Table(
            KEYS,
            meta,
            sa.Column("principal", sa.String, primary_key=True),
            sa.Column("release_key", sa.String, primary_key=True),
            sa.Column("fingerprint", sa.String, nullable=False),
            sa.Column("noise_key", sa.String, nullable=False),
            sa.Column("seq", sa.Integer),
            sa.Column("claimed_at", sa.DateTime, nullable=False),
            sa.Column("release", sa.Text),
            sa.Column("released_at", sa.DateTime),
        )
        self.windows = sa.Table(
            WINDOWS,
            meta,
            sa.Column("principal", sa.String, primary_key=True),
            sa.Column("window_name", sa.String, nullable=False),
        )
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
                    _owner_only(Path(f"{self._file}.wal"))
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
        with self.engine.connect() as conn:
            return conn.execute(
                sa.select(w.c.window_name).where(w.c.principal == principal)
            ).scalar_one_or_none()

    def total(self, principal: str) -> tuple[float, float] | None:
        p = self.principals
        with self.engine.connect() as conn:
            row = conn.execute(
                sa.select(p.c.epsilon, p.c.delta).where(p.c.principal == principal)
            ).first()
        return None if row is None else (float(row.epsilon), float(row.delta))

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
        the keys it names read in one query, its window read; each keyed entry checked (and,
        with `claim`, claimed) and `claims` made before decide() sees the stored costs and the
        new ones."""
        k = self.keys.c
        p = self.principals
        names = [e.key for e in entries if e.key is not None] + [c[0] for c in claims]
        names += [unless_stored] if unless_stored is not None else []

        def work(conn: sa.Connection) -> Charged:
            query = sa.select(p.c.epsilon, p.c.delta, p.c.charges).where(p.c.principal == principal)
            if self.dialect == "postgresql":
                query = query.with_for_update()
            row = conn.execute(query).first()
            if row is None:
                raise KeyError(f"principal {principal!r} has no budget in this ledger")
            found = {}
            if names:
                found = {
                    r.release_key: r
                    for r in conn.execute(
                        sa.select(
                            k.release_key, k.fingerprint, k.noise_key, k.seq, k.release
                        ).where((k.principal == principal) & k.release_key.in_(names))
                    )
                }
            stored = found.get(unless_stored)
            if stored is not None and stored.release is not None:  # answered meanwhile
                return Charged([], None, str(stored.release), {})
            noise_keys = {}
            for key, fingerprint, noise_key, release in claims:
                held = found.get(key)
                if held is None:
                    self._insert_key(conn, principal, key, fingerprint, noise_key, release)
                elif held.fingerprint != fingerprint:
                    raise key_conflict(principal, key)
                noise_keys[key] = noise_key if held is None else str(held.noise_key)
            seqs: list[int | None] = []
            for entry in entries:
                held = None if entry.key is None else found.get(entry.key)
                seqs.append(
                    None
                    if entry.key is None
                    else self._key_paid(conn, principal, entry, held, claim)
                )
            due = [e for e, seq in zip(entries, seqs, strict=True) if seq is None]
            if not due:
                return Charged(
                    [int(seq) for seq in seqs if seq is not None], None, None, noise_keys
                )
            w = self.windows.c
            window = conn.execute(
                sa.select(w.window_name).where(w.principal == principal)
            ).scalar_one_or_none()
            conn.execute(
                p.update().where(p.c.principal == principal).values(charges=p.c.charges + len(due))
            )
            after = decide(
                float(row.epsilon),
                float(row.delta),
                window,
                lambda since: self._costs(conn, principal, since),
                [e.cost for e in due],
            )
            seq, now, rows = int(row.charges), _now(), []
            for i, entry in enumerate(entries):
                if seqs[i] is None:
                    seq += 1
                    seqs[i] = seq
                    rows.append({"seq": seq, "mechanism": entry.mechanism, "cost": entry.cost})
                    if entry.key is not None:
                        keyed = (k.principal == principal) & (k.release_key == entry.key)
                        conn.execute(self.keys.update().where(keyed).values(seq=seq))
            composed = {"epsilon_after": after.epsilon, "delta_after": after.delta}
            conn.execute(
                self.charges.insert().values(
                    principal=principal, charged_at=now, rule=after.rule, **composed
                ),
                rows,
            )
            return Charged([int(s) for s in seqs if s is not None], after, None, noise_keys)

        return self._retry(work)

    def _insert_key(
        self, conn: sa.Connection, principal: str, key: str, fingerprint: Any, noise_key: str,
        release: str | None = None,
    ) -> None:  # fmt: skip
        now = _now()
        conn.execute(
            self.keys.insert().values(
                principal=principal,
                release_key=key,
                fingerprint=fingerprint,
                noise_key=noise_key,
                claimed_at=now,
                release=release,
                released_at=None if release is None else now,
            )
        )

    def _key_paid(
        self, conn: sa.Connection, principal: str, entry: ChargeEntry, held: Any, claim: bool
    ) -> int | None:
        """The charge number of the entry's key (its row `held`, or None) if it is charged
        already (nothing more to pay), else None; ReleaseKeyConflict if it holds another
        fingerprint; with `claim`, a key absent (or claimed, never charged nor answered) is
        claimed with the entry's."""
        k = self.keys.c
        if held is None:
            if not claim:
                raise KeyError(f"release key {entry.key!r} was not claimed")
            self._insert_key(conn, principal, str(entry.key), entry.fingerprint, entry.noise_key)
            return None
        if held.fingerprint != entry.fingerprint:
            unused = held.seq is None and held.release is None
            if not (claim and unused):  # reclaimed with other parameters meanwhile
                raise key_conflict(principal, str(entry.key))
            keyed = (k.principal == principal) & (k.release_key == entry.key)
            conn.execute(
                self.keys.update()
                .where(keyed)
                .values(fingerprint=entry.fingerprint, noise_key=entry.noise_key)
            )
            return None
        return None if held.seq is None else int(held.seq)

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
        with self.engine.connect() as conn:
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

        def store(conn: sa.Connection) -> str:
            conn.execute(
                self.keys.update()
                .where(keyed & k.release.is_(None))
                .values(release=release, released_at=_now())
            )
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
            if unless_charged is not None:
                p = self.principals.c
                lock = sa.select(p.charges).where(p.principal == principal)  # as a charge does
                conn.execute(lock.with_for_update() if self.dialect == "postgresql" else lock)
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
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.select(self.charges)
                .where(self.charges.c.principal == principal)
                .order_by(self.charges.c.seq)
            )
            return [dict(r._mapping) for r in rows]


def _ledger_file(url: sa.URL) -> Path | None:
    """The database file of a SQLite / DuckDB ledger URL (None: a server, or in memory)."""
    if url.get_backend_name() not in ("sqlite", "duckdb"):
        return None
    database = url.database or ""
    if database in ("", ":memory:") or database.startswith("file:") or database.startswith("md:"):
        return None
    return Path(database)


def _owner_only(path: Path) -> None:
    """chmod 0600 a file this process owns, if it exists (a DuckDB write-ahead log, which DuckDB
    creates with the process umask; it holds charges until the next checkpoint)."""
    try:
        if path.stat().st_uid == os.geteuid():
            path.chmod(0o600)
    except FileNotFoundError:
        pass


def _create_private(path: Path, dialect: str) -> None:
    """Create a new ledger file readable and writable by its owner only (0600): SQLite accepts
    an empty file as a new database (its journals take the database file's mode); DuckDB does
    not, so it creates the file itself under the umask 077. An existing file is left as it is."""
    if path.exists():
        return
    if dialect == "sqlite":
        try:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        except FileExistsError:
            pass
        return
    import duckdb

    with _UMASK_LOCK:
        old = os.umask(0o077)
        try:
            duckdb.connect(str(path)).close()
        finally:
            os.umask(old)
    _owner_only(path)


_UMASK_LOCK = threading.Lock()


def _immediate_transactions(engine: sa.Engine, wal: bool) -> None:
    """SQLite: let SQLAlchemy (not pysqlite) open transactions, and open them with BEGIN
    IMMEDIATE, which takes the database's write lock at once (one charge at a time). A ledger
    file is kept in write-ahead-log mode with synchronous = FULL: a commit is one fsync of the
    log (about 3 ms here, against about 17 ms for the rollback journal's several), still
    durable before it returns (invariant 10). The log and its index (-wal, -shm) take the
    database file's mode (0600); the file must be on a local disk (SQLite's WAL needs shared
    memory)."""

    @sa.event.listens_for(engine, "connect")
    def _no_driver_transactions(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        if wal:
            dbapi_connection.execute("PRAGMA journal_mode = WAL")
            dbapi_connection.execute("PRAGMA synchronous = FULL")

    @sa.event.listens_for(engine, "begin")
    def _begin_immediate(conn: sa.Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")


__all__ = ["CHARGES", "KEYS", "PRINCIPALS", "WINDOWS", "SQLLedgerStore"]
