"""The front ends, above the core (topk_middleware) and the adapters: what users call.

cli.py           the `topk-middleware` command (release, prepare, check, budget, demo, ...)
sql_function.py  `topk-middleware install-sql`: the SQL functions inside PostgreSQL
plpython.py      SPITable: the store the SQL functions read through PL/Python's SPI
sql/install.sql  the schema `topk` the SQL functions live in
"""
