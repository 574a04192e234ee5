"""The front ends, above the core (topk_middleware) and the adapters: what users call.

cli.py           the `topk-middleware` command (release, prepare, check, budget, demo, ...)
sql_function.py  `topk-middleware install-sql`: the SQL functions inside PostgreSQL
dbt_model.py     private_top_k_model: a private top-k table from a dbt Python model (dbt-duckdb)
plpython.py      SPITable: the store the SQL functions read through PL/Python's SPI
sql/install.sql  the schema `topk` the SQL functions live in
"""
