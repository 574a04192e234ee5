"""A durable privacy budget per principal (analyst), kept in a SQL database.

`PrivacyLedger(url_or_engine)` opens (and creates, if absent) two tables through SQLAlchemy, which
speaks to PostgreSQL (psycopg), SQLite and DuckDB (duckdb-engine) alike with one schema:

    topk_ledger_principals(principal TEXT PRIMARY KEY, epsilon FLOAT, delta FLOAT,
                           charges INTEGER)  -- the total allowed, and how many charges so far
    topk_ledger_charges(principal TEXT, seq INTEGER, charged_at TIMESTAMP, mechanism TEXT,
                        cost TEXT (JSON), epsilon_after FLOAT, delta_after FLOAT, rule TEXT,
                        released_at TIMESTAMP NULL, guarantee TEXT NULL (JSON),
                        source TEXT NULL, diagnostics TEXT NULL (JSON),
                        PRIMARY KEY (principal, seq))

`ledger.budget(principal, epsilon, delta)` gives a budget object usable as `budget=` by every
mechanism. A charge is one transaction, committed before the mechanism reads any row: it locks the
principal's row (PostgreSQL `SELECT ... FOR UPDATE`; SQLite `BEGIN IMMEDIATE`, one writer at a time;
DuckDB: every charge updates the principal's row, so concurrent charges conflict and are retried),
reads every cost charged so far, composes them with the new one (accounting.compose, the rules of
PrivacyBudget) and inserts the charge only if the total still holds. So threads and processes
sharing a ledger never overspend it, and a process killed after the charge leaves it charged.
When the release is done, its row is completed with the release time, its guarantee and source,
and the operator diagnostics (access counts, method, m; for an oblivious release also its depth,
deadline, work time, whether the work overran the deadline and whether it missed: OBLIVIOUS_LOG):
operator-side only.
DuckDB allows one writing process per database file: share a DuckDB ledger between threads, or
use PostgreSQL / SQLite for several processes.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from .accounting import (
    BudgetExceeded,
    ComposedGuarantee,
    PrivacyCost,
    check_budget_total,
    compose,
    refuse_if_over,
)

PRINCIPALS = "topk_ledger_principals"
CHARGES = "topk_ledger_charges"
DUCKDB_RETRIES = 200
# What the log of an oblivious release keeps besides its access counts (mechanisms/oblivious.py):
# its depth, its deadline, how long its work took, whether that overran the deadline, and whether
# it missed (read the whole table after the fixed batches).
OBLIVIOUS_LOG = ("depth", "deadline", "work_seconds", "deadline_missed", "miss", "full_read")


def cost_to_json(cost: PrivacyCost) -> str:
    """A cost as JSON; a cost with an RDP curve must carry its recipe."""
    if cost.rdp is not None and cost.recipe is None:
        raise ValueError(f"{cost.mechanism}: an RDP curve without a recipe cannot be stored")
    fields = {f.name: getattr(cost, f.name) for f in dataclasses.fields(cost) if f.name != "rdp"}
    return json.dumps(fields)


class UnknownRecipe(ValueError):
    """A stored charge names a recipe outside the project's registry (RECIPES): never run."""


def _stable_cost(**kwargs: Any) -> PrivacyCost:
    from .mechanisms.stable import stable_cost

    return stable_cost(**kwargs)


# The only functions a stored charge may name to rebuild its cost (a cost whose RDP curve is a
# function cannot be stored as data): a fixed table of the project's own cost functions, with the
# parameters each takes and their types. A stored name is looked up here and nowhere else; nothing
# a row says is imported or called.
RECIPES: dict[str, tuple[Callable[..., PrivacyCost], dict[str, tuple[type, ...]]]] = {
    "topk_middleware.mechanisms.stable:stable_cost": (
        _stable_cost,
        {"rho": (float, int), "delta_t": (float, int), "test": (str,), "target": (bool,)},
    ),
}


def _from_recipe(recipe: Any) -> PrivacyCost:
    """The cost a stored recipe names, from RECIPES only; anything else is UnknownRecipe."""
    try:
        name, pairs = recipe
        kwargs = dict(pairs)
    except (TypeError, ValueError):
        raise UnknownRecipe("a ledger charge holds a malformed recipe; it was not run") from None
    entry = RECIPES.get(name) if isinstance(name, str) else None
    if entry is None:
        shown = name if isinstance(name, str) and len(name) <= 80 else "(not shown)"
        raise UnknownRecipe(
            f"a ledger charge names the recipe {shown!r}, which is not one of the project's cost "
            f"functions ({', '.join(sorted(RECIPES))}); it was not run: the ledger was written by "
            "something else than this project"
        )
    function, parameters = entry
    for key, value in kwargs.items():
        allowed = parameters.get(key) if isinstance(key, str) else None
        if allowed is None or not isinstance(value, allowed):
            raise UnknownRecipe(
                f"a ledger charge gives the recipe {name!r} a parameter it does not take or of "
                "the wrong type; it was not run"
            )
    return function(**kwargs)


def cost_from_json(text: str) -> PrivacyCost:
    """A stored cost; a recipe is rebuilt through the registry RECIPES, never imported."""
    data = json.loads(text)
    if data.get("recipe"):
        return _from_recipe(data["recipe"])
    data["range_bounded"] = tuple(data["range_bounded"])
    data["approx"] = tuple(tuple(pair) for pair in data["approx"])
    data["sources"] = tuple(data["sources"])
    data["recipe"] = None
    return PrivacyCost(**data)


class PrivacyLedger:
    """Per-principal budgets in a database (module docstring)."""

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
                _immediate_transactions(engine)
        self.engine = engine
        meta = sa.MetaData()
        self.principals = sa.Table(
            PRINCIPALS,
            meta,
            sa.Column("principal", sa.String, primary_key=True),
            sa.Column("epsilon", sa.Float(53), nullable=False),
            sa.Column("delta", sa.Float(53), nullable=False),
            sa.Column("charges", sa.Integer, nullable=False),
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
        self._retry(lambda conn: meta.create_all(conn, checkfirst=True))

    # ----- transactions --------------------------------------------------------------------
    def _retry(self, work: Any) -> Any:
        """Run `work(conn)` in one transaction; on DuckDB retry it after a write conflict."""
        for attempt in range(DUCKDB_RETRIES):
            try:
                with self.engine.begin() as conn:
                    done = work(conn)
                if self._file is not None and self.dialect == "duckdb":
                    _owner_only(Path(f"{self._file}.wal"))
                return done
            except sa.exc.DBAPIError as error:
                conflict = "conflict" in str(error).lower() or "already exists" in str(error)
                if self.dialect != "duckdb" or not conflict or attempt == DUCKDB_RETRIES - 1:
                    raise
                time.sleep(0.001 * (attempt + 1))
        raise AssertionError("unreachable")

    def budget(self, principal: str, epsilon: float, delta: float = 0.0) -> LedgerBudget:
        """The budget of `principal`: created with this total if new; if it exists, its stored
        total must be this one (an analyst cannot raise their own total through this call)."""
        if not isinstance(principal, str) or not principal:
            raise TypeError(f"principal must be a non-empty string, got {principal!r}")
        check_budget_total(epsilon, delta)
        epsilon, delta = float(epsilon), float(delta)

        def create(conn: sa.Connection) -> tuple[float, float]:
            row = conn.execute(
                sa.select(self.principals.c.epsilon, self.principals.c.delta).where(
                    self.principals.c.principal == principal
                )
            ).first()
            if row is None:
                conn.execute(
                    self.principals.insert().values(
                        principal=principal, epsilon=epsilon, delta=delta, charges=0
                    )
                )
                return epsilon, delta
            return float(row.epsilon), float(row.delta)

        try:
            stored = self._retry(create)
        except sa.exc.IntegrityError:  # created concurrently: read what was stored
            stored = self._retry(create)
        if stored != (epsilon, delta):
            raise ValueError(
                f"principal {principal!r} has the total (epsilon={stored[0]:g}, "
                f"delta={stored[1]:g}) in the ledger, not ({epsilon:g}, {delta:g})"
            )
        return LedgerBudget(self, principal, epsilon, delta)

    def _costs(self, conn: sa.Connection, principal: str) -> list[PrivacyCost]:
        rows = conn.execute(
            sa.select(self.charges.c.cost)
            .where(self.charges.c.principal == principal)
            .order_by(self.charges.c.seq)
        )
        return [cost_from_json(r.cost) for r in rows]

    def charge(self, principal: str, cost: PrivacyCost) -> tuple[int, ComposedGuarantee]:
        """Add `cost` to the principal's releases in one committed transaction, or raise
        BudgetExceeded and record nothing. Returns (charge seq, composition after it)."""
        text = cost_to_json(cost)

        def work(conn: sa.Connection) -> tuple[int, ComposedGuarantee]:
            p = self.principals
            # Lock the principal's row (every dialect: a write; PostgreSQL: FOR UPDATE first).
            query = sa.select(p.c.epsilon, p.c.delta, p.c.charges).where(p.c.principal == principal)
            if self.dialect == "postgresql":
                query = query.with_for_update()
            row = conn.execute(query).first()
            if row is None:
                raise KeyError(f"principal {principal!r} has no budget in this ledger")
            conn.execute(
                p.update().where(p.c.principal == principal).values(charges=p.c.charges + 1)
            )
            costs = self._costs(conn, principal)
            before = compose(costs, float(row.delta)) if costs else None
            after = compose([*costs, cost], float(row.delta))
            refuse_if_over(after, float(row.epsilon), float(row.delta), cost, before)
            seq = int(row.charges) + 1
            conn.execute(
                self.charges.insert().values(
                    principal=principal,
                    seq=seq,
                    charged_at=dt.datetime.now(dt.UTC).replace(tzinfo=None),
                    mechanism=cost.mechanism,
                    cost=text,
                    epsilon_after=after.epsilon,
                    delta_after=after.delta,
                    rule=after.rule,
                )
            )
            return seq, after

        return self._retry(work)

    def log_release(self, principal: str, seq: int, result: Any) -> None:
        """Complete charge `seq` with its release: time, guarantee, source, diagnostics."""
        privacy = result.privacy
        guarantee = {"epsilon": privacy.epsilon, "delta": privacy.delta, "noise": privacy.noise}
        diagnostics = {
            "method": result.method,
            "m": result.m,
            "accesses": dataclasses.asdict(result.accesses),
        }
        plan = getattr(result, "plan", None) or {}
        if plan.get("oblivious"):  # what the operator watches: overruns and misses
            diagnostics["oblivious"] = {key: plan.get(key) for key in OBLIVIOUS_LOG}
        c = self.charges.c
        self._retry(
            lambda conn: conn.execute(
                self.charges.update()
                .where((c.principal == principal) & (c.seq == seq))
                .values(
                    released_at=dt.datetime.now(dt.UTC).replace(tzinfo=None),
                    guarantee=json.dumps(guarantee),
                    source=privacy.derivation,
                    diagnostics=json.dumps(diagnostics, default=str),
                )
            )
        )

    def spent(self, principal: str) -> ComposedGuarantee:
        """The composition of everything charged to `principal` (after any restart)."""

        def work(conn: sa.Connection) -> ComposedGuarantee:
            row = conn.execute(
                sa.select(self.principals.c.delta).where(self.principals.c.principal == principal)
            ).first()
            if row is None:
                raise KeyError(f"principal {principal!r} has no budget in this ledger")
            return compose(self._costs(conn, principal), float(row.delta))

        return self._retry(work)

    def log(self, principal: str) -> list[dict[str, Any]]:
        """The principal's charges and releases, oldest first (operator view)."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.select(self.charges)
                .where(self.charges.c.principal == principal)
                .order_by(self.charges.c.seq)
            )
            return [dict(r._mapping) for r in rows]

    def dp_events(self, principal: str) -> Any:
        """The principal's releases as one dp_accounting ComposedDpEvent (release_dp_event each;
        needs the dp-accounting extra)."""
        from dp_accounting import dp_event

        with self.engine.connect() as conn:
            costs = self._costs(conn, principal)
        return dp_event.ComposedDpEvent([release_dp_event(c) for c in costs])


def release_dp_event(cost: PrivacyCost) -> Any:
    """One release as a dp_accounting DpEvent. dp_accounting has no event for a bare
    (epsilon, delta) pair, so: a release with delta = 0 and a zCDP rho (the Gumbel / exponential
    family: range-bounded, Cesar & Rogers 2021) is ZCDpEvent(rho); a pure epsilon-DP release
    without one is ZCDpEvent(epsilon^2 / 2) (Bun & Steinke 2016, Prop. 1.4); a release with a
    failure probability delta > 0 (limited domain, StableTopK) is an UnsupportedDpEvent, which
    dp_accounting's accountants refuse rather than under-count."""
    from dp_accounting import dp_event

    if cost.delta == 0.0 and cost.rho is not None:
        return dp_event.ZCDpEvent(cost.rho)
    if cost.delta == 0.0 and cost.epsilon is not None:
        return dp_event.ZCDpEvent(cost.epsilon**2 / 2.0)
    return dp_event.UnsupportedDpEvent()


class LedgerBudget:
    """One principal's budget in a PrivacyLedger, usable as `budget=` by every mechanism."""

    def __init__(self, ledger: PrivacyLedger, principal: str, epsilon: float, delta: float):
        self.ledger, self.principal = ledger, principal
        self.epsilon, self.delta = epsilon, delta
        self._pending = threading.local()

    def charge(self, cost: PrivacyCost) -> ComposedGuarantee:
        seq, after = self.ledger.charge(self.principal, cost)
        self._pending.seq = seq
        return after

    def log_release(self, result: Any) -> None:
        seq = getattr(self._pending, "seq", None)
        if seq is not None:
            self._pending.seq = None
            self.ledger.log_release(self.principal, seq, result)

    def spent(self) -> ComposedGuarantee:
        return self.ledger.spent(self.principal)

    @property
    def releases(self) -> list[PrivacyCost]:
        with self.ledger.engine.connect() as conn:
            return self.ledger._costs(conn, self.principal)


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


def _immediate_transactions(engine: sa.Engine) -> None:
    """SQLite: let SQLAlchemy (not pysqlite) open transactions, and open them with BEGIN
    IMMEDIATE, which takes the database's write lock at once (one charge at a time)."""

    @sa.event.listens_for(engine, "connect")
    def _no_driver_transactions(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None

    @sa.event.listens_for(engine, "begin")
    def _begin_immediate(conn: sa.Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")


__all__ = ["BudgetExceeded", "LedgerBudget", "PrivacyLedger", "release_dp_event"]
