"""The front ends, above the core (topk_middleware) and the adapters: what users call.

cli/             the `topk-middleware` command (release, prepare, check, budget, demo, ...)
sql/             `topk-middleware install-sql`: the SQL functions inside PostgreSQL (PL/Python)
sql_function.py  the names of sql/ under one module (the import of installed function bodies)
duckdb_sql.py    private_top_k as a DuckDB table function (register_private_top_k)
polars_ns.py     the Polars namespace `topk`
dbt_model.py     private_top_k_model: a private top-k table from a dbt Python model (dbt-duckdb)
plpython.py      SPITable: the store the SQL functions read through PL/Python's SPI
"""
