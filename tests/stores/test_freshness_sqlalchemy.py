"""SQLAlchemy copy mode reading the table itself (adapters/sql/table_read.py): the
in-store one-shot on the counts table has the one-shot law.

The copy is prepared, then made stale by one write, so every release reads the table. Five
items stand out
of zeros by ln(m) + 0, 0.5, ..., 2 Gumbel scales, so item i wins top-1 with probability
exp(h_i / b) / sum_j exp(h_j / b) (Gumbel-max, Fact 3.3 with k = 1). Positions are slots with
holes, so that empty positions and the split at the default level (about 1,024 exceedances
drawn over the slots) are both exercised: on SQLite ids are the rowids, spread 20 apart (100,000
slots for 5,000 rows); on PostgreSQL the table is at fillfactor 10 (18 rows a page of 291
slots). Chi-square over 500 seeded releases, p > 0.001 (fails with probability 0.001 if the law
holds; fails for a position map that names the wrong row, noise computed for the wrong
position, an exceedance read twice or lost, or an empty slot that wins).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import sqlalchemy as sa

from adapters.sqlalchemy import SQLAlchemyTable
from tests.stores_sqlalchemy import unique_name
from topk_middleware import private_top_k
from topk_middleware.privacy import calibrate

M = 5000
RUNS = 500


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql"])
def test_the_one_shot_on_the_table_has_the_exponential_law(
    request: pytest.FixtureRequest, dialect: str
) -> None:
    from scipy import stats

    engine: sa.Engine = request.getfixturevalue(
        f"sqlalchemy_{dialect.replace('postgresql', 'postgres')}_engine"
    )
    b = calibrate("gumbel", 1, M, 1.0, 0.0).scale
    lifts = np.array([0.0, 0.5, 1.0, 1.5, 2.0])
    tops = b * (np.log(M) + lifts)
    name = unique_name("law")
    spread = 20 if dialect == "sqlite" else 1
    ids = np.arange(M) * spread + 7
    scores = np.zeros(M)
    scores[[3, 1200, 2500, 3700, 4999]] = tops
    with engine.begin() as conn:
        if dialect == "sqlite":  # INTEGER PRIMARY KEY: the id is the rowid
            columns, fill = "id INTEGER PRIMARY KEY, score REAL NOT NULL", ""
        else:
            columns = "id BIGINT PRIMARY KEY, score DOUBLE PRECISION NOT NULL"
            fill = " WITH (fillfactor = 10)"
        conn.exec_driver_sql(f"CREATE TABLE {name} ({columns}){fill}")
        table = sa.table(name, sa.column("id"), sa.column("score"))
        conn.execute(
            table.insert(),
            [{"id": int(i), "score": float(s)} for i, s in zip(ids, scores, strict=True)],
        )
    source = SQLAlchemyTable(engine, name)
    source.prepare()
    with engine.begin() as conn:  # a write that changes nothing: the copy is no longer proven
        conn.exec_driver_sql(f"UPDATE {name} SET score = score WHERE id = 7")
    winners = [int(ids[i]) for i in (3, 1200, 2500, 3700, 4999)]
    try:
        counts = np.zeros(6)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            with source.snapshot():
                assert source.domain_size() == M, source.run_freshness()
                assert source.oneshot_positions() >= 64 * 1024, source.run_freshness()
            for seed in range(RUNS):
                result = private_top_k(source, k=1, epsilon=1.0, method="oneshot", seed=seed)
                assert result.plan["in_store"] and result.plan["freshness"]["read"] == "table"
                item = int(result.items[0])
                counts[winners.index(item) if item in winners else 5] += 1
        weights = np.concatenate([np.exp(tops / b), [M - 5.0]])
        assert stats.chisquare(counts, weights / weights.sum() * RUNS).pvalue > 1e-3
    finally:
        source.uninstall()
        with engine.begin() as conn:
            conn.exec_driver_sql(f"DROP TABLE {name}")


@pytest.mark.parametrize("dialect", ["sqlite", "postgres", "mariadb", "duckdb"])
def test_bad_rows_written_since_the_copy_are_refused(
    request: pytest.FixtureRequest, dialect: str
) -> None:
    """A run that reads the table checks what it reads now (one aggregate pass): a negative
    score, a NULL score and, on a table without a unique key, a duplicate id written since the
    copy are refused in the project's words before anything is released."""
    make = request.getfixturevalue(f"make_sqlalchemy_{dialect}_source")
    source = make(np.arange(50) * 2, None, frozen=False)
    t = source.engine.dialect.identifier_preparer.quote(source.table_name)

    def write(statement: str) -> None:
        with source.engine.begin() as conn:
            conn.exec_driver_sql(statement.format(t=t))

    write("UPDATE {t} SET score = -1 WHERE id = 3")
    with pytest.raises(ValueError, match="has 1 negative score"):
        private_top_k(source, k=2, epsilon=1.0)
    write("UPDATE {t} SET score = NULL WHERE id = 3")
    with pytest.raises(ValueError, match="has 1 NULL score"):
        private_top_k(source, k=2, epsilon=1.0)
    write("UPDATE {t} SET score = 6 WHERE id = 3")
    write("INSERT INTO {t} (id, score) VALUES (3, 6)")
    with pytest.raises(ValueError, match="duplicate ids"):
        private_top_k(source, k=2, epsilon=1.0)
