"""What one SQL store does in its own words: the surface a dialect fills for the engine.

The engine (adapters/sql/engine.py) holds every idea a rank-ordered SQL store shares: the copy's
lifecycle, the canonical order, the runs of tied scores, the freshness proof, the reads, the
in-store one-shot, the refusals. A dialect holds only what differs from one store to the next,
as methods and `supports_*` flags, never as a branch in the engine (docs/writing-a-store.md):

* how a statement runs and what it returns (`query`: named parameters bound by the driver,
  columns back as numpy arrays), and how a name is quoted;
* reflection (`columns`: a table's columns and their kinds, None where no such table);
* DDL (`create_rank_table`, `create_runs_table`, `drop_table`): the copy is a table of
  (rank, id, score) in canonical order, built in the store;
* the freshness proof (`fingerprint`): a value that changes with every write to the table;
* binding an array (`in_array`) and the keyed uniform of an item (`keyed_uniform`: SHA-256 of
  "key:position", its first 52 bits), for the in-store one-shot;
* the measured cost record (`costs`, access.StoreCosts) the planner prices reads with.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from topk_middleware.access import StoreCosts

# The kinds of column the engine tells apart (`Dialect.kind`).
INTEGER, FLOAT, TEXT = "integer", "float", "text"


class Dialect:
    """The base of every dialect: the flags a store declares and the methods it fills.

    `supports_in_store_oneshot`: the store computes keyed noise in SQL (SHA-256) and its driver
    keeps parameters out of the statement text. `parameters_in_text`: the driver writes
    parameters into the statement text a server observer reads (access.StoreTraits): then no
    secret is sent, and the in-store one-shot is off."""

    name = "sql"
    supports_in_store_oneshot = False
    parameters_in_text = False
    costs = StoreCosts()

    def costs_for(self, m: int) -> StoreCosts:
        """The cost record for a copy of m rows (where a cost grows with the table)."""
        return self.costs

    def query(self, sql: str, params: dict[str, Any] | None = None) -> dict[str, np.ndarray]:
        """Run one statement; its result's columns by name (empty for DDL)."""
        raise NotImplementedError

    def quote(self, name: str) -> str:
        """A quoted identifier (any text: spaces, quotes, capitals, keywords)."""
        raise NotImplementedError

    def qualified(self, namespace: str, name: str) -> str:
        """namespace.name, each part quoted."""
        return f"{self.quote(namespace)}.{self.quote(name)}"

    def resolve(self, table: str, namespace: str | None) -> tuple[str, str]:
        """The (namespace, table) a name means in the store, however it was spelt: the copy's
        names derive from it, so that cleanup finds them from any spelling."""
        raise NotImplementedError

    def columns(self, namespace: str, table: str) -> dict[str, str] | None:
        """The table's columns and their kinds (INTEGER, FLOAT, TEXT, or the store's type name
        for any other), in order; None where there is no such table."""
        raise NotImplementedError

    def create_rank_table(self, target: str, source: str, id: str, score: str) -> None:
        """Create `target` (qualified) as (rank, id, score) of `source` in canonical order:
        rank 0.. by score descending, ties by id ascending in byte order."""
        raise NotImplementedError

    def create_runs_table(self, target: str, ranks: str) -> None:
        """Create `target` as (first, score): the first rank of each run of tied scores."""
        raise NotImplementedError

    def drop_table(self, qualified: str) -> None:
        raise NotImplementedError

    def create_manifest(self, target: str) -> None:
        """Create `target`, if missing, as (version, fingerprint, m, runs): the copy's
        versions (adapters/sql/engine.py)."""
        raise NotImplementedError

    def record_version(
        self, manifest: str, version: int, fingerprint: str, m: int, runs: int
    ) -> None:
        raise NotImplementedError

    def forget_version(self, manifest: str, version: int) -> None:
        raise NotImplementedError

    def double(self, expr: str) -> str:
        """SQL of `expr` as a double."""
        return f"CAST({expr} AS DOUBLE PRECISION)"

    def tables_like(self, namespace: str, prefix: str) -> list[str]:
        """The names of the tables in `namespace` that start with `prefix`."""
        raise NotImplementedError

    def fingerprint(self, namespace: str, table: str) -> str:
        """A value that changes whenever the table's rows may have changed (a write, a rebuild,
        a truncation); it may change without a write (then the copy is rebuilt for nothing),
        never stay put across one."""
        raise NotImplementedError

    def in_array(self, param: str, kind: str) -> str:
        """SQL of the array bound as parameter `param` with elements of `kind`, for IN."""
        raise NotImplementedError

    def keyed_uniform(self, key_param: str, position: str) -> str:
        """SQL of U_p (keyed_noise.py): the first 52 bits of SHA-256(key ":" position), plus
        1/2, over 2^52."""
        raise NotImplementedError

    def oneshot_sql(self, ranks: str, noise_sql: str, score: str, bound: float, k: int) -> str:
        """SQL of the in-store one-shot over the rank table (keyed_noise.py's split and cut),
        with parameters positions, noises and key, columns (rank, id, score) of the k best."""
        raise NotImplementedError
