"""The SQL functions inside PostgreSQL (PL/Python): the schema topk that install-sql puts in.

topk.private_top_k, private_top_k_with_counts, exponential_mechanism, peeling_top_k, joint_top_k
and limited_domain_top_k (the mechanisms of topk_middleware/mechanisms that fit one
table-function call), each charged its module's own cost through `budget=`; a bottom symbol
(limited domain) is a last row with item NULL. Beside them topk.last_guarantee, topk.my_budget,
and the administrators' topk.grant_budget and topk.spent. One module per idea:

install.sql   the schema's tables and helpers (settings, registrations, grants, refusals)
server/       the library topk_server: the C forms of topk._refuse and of the hidden window
functions.py  the SQL text of every function (a PL/Python body and its plpgsql front), BOOT
hiding.py     what an analyst who watches the server cannot see: pinned and held settings
install.py    install, uninstall, stage: the client side of install-sql and uninstall-sql
sources.py    registered tables: register_source, and their registration read in the server
ledger.py     the budget ledger reached from the server: its role, its connection, the budgets
refusals.py   refusals in the project's words, before anything is read or charged
keys.py       release keys: a retried call gets the stored answer and is not charged again
bodies.py     what the PL/Python bodies call (GD["topk"]): one server_* per function

Nothing is imported here, so that a command importing one module loads no other. The names of
the package are also reachable as frontends.sql_function (the import of function bodies
installed with that module's BOOT).
"""
