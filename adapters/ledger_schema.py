"""The privacy ledger's tables (adapters/ledger.py's docstring says what each row means)."""

from __future__ import annotations

import sqlalchemy as sa

PRINCIPALS = "topk_ledger_principals"
CHARGES = "topk_ledger_charges"
KEYS = "topk_ledger_keys"
WINDOWS = "topk_ledger_windows"


def ledger_tables(meta: sa.MetaData) -> tuple[sa.Table, sa.Table, sa.Table, sa.Table]:
    """(principals, charges, keys, windows) defined in `meta`: one schema for every dialect."""
    principals = sa.Table(
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
    charges = sa.Table(
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
    keys = sa.Table(
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
    windows = sa.Table(
        WINDOWS,
        meta,
        sa.Column("principal", sa.String, primary_key=True),
        sa.Column("window_name", sa.String, nullable=False),
    )
    return principals, charges, keys, windows


__all__ = ["CHARGES", "KEYS", "PRINCIPALS", "WINDOWS", "ledger_tables"]
