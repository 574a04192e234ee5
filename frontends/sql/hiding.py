"""What keeps a function's inner work from an analyst who watches the server (docs/security.md).

Every function pins the settings that would show its internal queries, their plans or bound values,
or count its reads (PINNED_SETTINGS, with the plan settings of
adapters/dialects/postgres/oblivious.py), and holds at the installing session's value those that
would move its plans, memory or time (HELD_SETTINGS_QUERY); `pinned_clauses` writes both as the
functions' SET clauses. Each plpgsql front (functions.py) keeps its body's buffer and WAL use out of
the caller's EXPLAIN and statistics between topk._hide_io_begin and topk._hide_io_end;
`install_native` puts in their C forms, and topk._refuse's, from the library topk_server
(server/topk_server.c). The other halves: long loops answer cancel, statement_timeout and terminate
(bodies.py, through topk_middleware/interrupts.py), and a refusal whose reason is a fact of the data
reaches the analyst as a reference only (refusals.py).
"""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import Any

from topk_middleware.names import first_line

# Settings every SQL function pins for its own duration (function-level SET clauses, applied as
# the superuser owner of these SECURITY DEFINER functions), so that an analyst's session settings
# cannot make the server show it the internal queries, their plans or bound values, and so that
# the function's reads stay out of the statistics views any role reads (track_counts off:
# pg_stat_user_tables and pg_stat_xact_user_tables see none of them); with them, the plans of
# its reads (PINNED_PLAN_SETTINGS of adapters/dialects/postgres/oblivious.py: generic plans, no
# parallel workers, one join method and scan kind per query; added by pinned_settings(), which
# imports them only when SQL is written, so that the command line's help stays light), so that they
# follow neither the analyst's settings nor the planner's statistics. Those absent from a server
# (an extension not loaded) are left out at install time (install_sql_text).
PINNED_SETTINGS = (
    ("debug_print_parse", "off"),
    ("debug_print_rewritten", "off"),
    ("debug_print_plan", "off"),
    ("client_min_messages", "error"),
    ("log_min_messages", "warning"),
    ("log_statement", "none"),
    ("log_duration", "off"),
    ("log_min_duration_statement", "-1"),
    ("log_min_duration_sample", "-1"),
    ("log_parser_stats", "off"),
    ("log_planner_stats", "off"),
    ("log_executor_stats", "off"),
    ("log_statement_stats", "off"),
    ("log_parameter_max_length_on_error", "0"),
    ("trace_sort", "off"),
    ("trace_notify", "off"),
    ("track_counts", "off"),
    ("track_io_timing", "off"),
    ("track_functions", "none"),
    ("auto_explain.log_min_duration", "-1"),
    ("pg_stat_statements.track", "none"),
)


def pinned_settings() -> tuple[tuple[str, str], ...]:
    """PINNED_SETTINGS and the pinned plan settings (plan_cache_mode = force_generic_plan and
    jit = off among them)."""
    from adapters.dialects.postgres.oblivious import PINNED_PLAN_SETTINGS

    return (*PINNED_SETTINGS, *PINNED_PLAN_SETTINGS)


# The settings any role may change that move the plans, the memory or the time of a function's
# internal queries, or how their values read back: every one of them is held at the installing
# session's value (`SET name FROM CURRENT`) where pinned_settings() gives it no value, so that an
# analyst's random_page_cost, cpu_*_cost, enable_*, work_mem, DISCARD PLANS (a replan under the
# caller's settings) and the like change nothing inside. temp_buffers is left out (it cannot
# change once a session has used a temporary table); statement_timeout and lock_timeout are the
# caller's (they end its own statement).
HELD_SETTINGS_QUERY = (
    "SELECT name FROM pg_settings WHERE context = 'user' AND name <> 'temp_buffers' AND ("
    "category LIKE 'Query Tuning%' OR category IN ('Resource Usage / Memory', "
    "'Resource Usage / Asynchronous Behavior') OR name IN ('synchronize_seqscans', "
    "'transform_null_equals', 'array_nulls', 'standard_conforming_strings', 'backslash_quote', "
    "'extra_float_digits', 'bytea_output', 'DateStyle', 'IntervalStyle', 'TimeZone', "
    "'row_security'))"
)


def pinned_clauses(available: Collection[str] | None = None, held: Collection[str] = ()) -> str:
    """The SET clauses of pinned_settings() (those in `available`, the server's pg_settings),
    then `SET name FROM CURRENT` for each of `held` (HELD_SETTINGS_QUERY) they leave out."""
    pinned = [(n, v) for n, v in pinned_settings() if available is None or n in available]
    named = {n.lower() for n, _ in pinned}
    return " ".join(
        [f"SET {name} = '{value}'" for name, value in pinned]
        + [f'SET "{name}" FROM CURRENT' for name in sorted(held) if name.lower() not in named]
    )


# The C helpers of the library topk_server (frontends/sql/server/topk_server.c):
# (signature, C symbol).
NATIVE_FUNCTIONS = (
    ("_refuse(state text, message text, hint text)", "topk_refuse"),
    ("_hide_io_begin()", "topk_hide_io_begin"),
    ("_hide_io_end()", "topk_hide_io_end"),
)


def install_native(conn: Any) -> tuple[bool, str]:
    """Replace the PL/pgSQL forms of install.sql (topk._refuse, _hide_io_begin, _hide_io_end)
    with the C forms of the library topk_server (built by scripts/ensure-server-side.sh), all or
    none: (True, "") where it did, else (False, why: the server's words, e.g. no such file, or a
    library built for another major version)."""
    import psycopg

    try:
        with conn.transaction():
            for signature, symbol in NATIVE_FUNCTIONS:
                conn.execute(
                    f"CREATE OR REPLACE FUNCTION topk.{signature} RETURNS void LANGUAGE c "
                    f"VOLATILE AS '$libdir/topk_server', '{symbol}'"
                )
                bare = re.sub(r"\b(state|message|hint) ", "", signature)
                conn.execute(f"REVOKE EXECUTE ON FUNCTION topk.{bare} FROM PUBLIC")
    except psycopg.Error as error:  # the savepoint rolled back: the PL/pgSQL forms stay
        return False, first_line(error)
    return True, ""
