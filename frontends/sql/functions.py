"""The SQL text of schema topk's functions: each a PL/Python body and the plpgsql front granted.

SQL_FUNCTIONS lists them (SqlFunction); `function_sql` writes one, `install_sql_text` writes
install.sql followed by all of them, dropping superseded signatures first and giving the EXECUTE
grants administrators gave on those again. Every body starts with BOOT, which makes the project
importable in the server's Python once per session and keeps frontends.sql.bodies in GD["topk"].
Cost: string work only, once per install-sql.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass
from importlib import resources

from frontends.sql.hiding import pinned_clauses

SCHEMA = "topk"

# The first lines of every PL/Python body: make the project importable, once per session.
BOOT = """if "topk" not in GD:
    import site, sys
    _where = plpy.execute("SELECT project_path, site_packages FROM topk.settings")
    if not len(_where):
        plpy.error("topk: not installed (no row in topk.settings): run topk-middleware install-sql")
    sys.path.insert(0, _where[0]["project_path"])
    site.addsitedir(_where[0]["site_packages"])
    from frontends.sql import bodies
    GD["topk"] = bodies"""


@dataclass(frozen=True)
class SqlFunction:
    """A function of schema topk, installed as a pair: a PL/Python body `topk.<body>` that calls
    `<server>` of frontends.sql.bodies, and the plpgsql front `topk.<name>` that administrators
    grant, which turns the project's refusals into plain SQL errors (topk._refuse). Both are
    SECURITY DEFINER, and EXECUTE on both is revoked from PUBLIC. Releases are STABLE: every SPI
    query of a call runs in the calling statement's snapshot, while their writes (the charge, the
    log) go through the ledger's own connection, committed at once."""

    name: str
    body: str
    params: str  # the front's parameters, defaults included
    returns: str
    server: str
    volatility: str = "STABLE"
    comment: str = ""
    public: bool = False  # EXECUTE granted to PUBLIC (what every role may ask about itself)


RELEASE = 'TABLE("position" integer, item text)'

# The last parameter of every release function: a call under a key already answered returns the
# stored rows and charges nothing (keys.py).
KEY_PARAMETER = "release_key text DEFAULT NULL"
SQL_FUNCTIONS = (
    SqlFunction(
        "private_top_k",
        "_release",
        "source regclass, k integer, epsilon double precision, "
        "delta double precision DEFAULT 0, noise text DEFAULT 'gumbel', "
        "oblivious boolean DEFAULT true, " + KEY_PARAMETER,
        RELEASE,
        "server_release",
        comment="Private top-k (Wu, Ohrimenko, Wirth 2023): best first with Gumbel noise, a set "
        "in id order with Laplace; charged to session_user. oblivious (the default): reads and "
        "wall time fixed by m, k, epsilon and delta, guarantee (epsilon, delta + (1 + e^epsilon) "
        "* 1e-9).",
    ),
    SqlFunction(
        "private_top_k_with_counts",
        "_release_with_counts",
        "source regclass, k integer, epsilon double precision, "
        "delta double precision DEFAULT 0, noise text DEFAULT 'gumbel', "
        "counts_share double precision DEFAULT 0.5, oblivious boolean DEFAULT true, "
        + KEY_PARAMETER,
        'TABLE("position" integer, item text, count bigint, count_error bigint)',
        "server_release_with_counts",
        comment="Private top-k with each item's noisy count (exact discrete Laplace noise; "
        "count_error: the half-width of a 95% interval); counts_share of epsilon goes to the "
        "counts; charged to session_user; oblivious reads by default.",
    ),
    SqlFunction(
        "exponential_mechanism",
        "_exponential_mechanism",
        "source regclass, epsilon double precision, oblivious boolean DEFAULT true, "
        + KEY_PARAMETER,
        RELEASE,
        "server_exponential",
        comment="The exponential mechanism (k = 1), charged to session_user; oblivious reads "
        "by default.",
    ),
    SqlFunction(
        "peeling_top_k",
        "_peeling_top_k",
        "source regclass, k integer, epsilon double precision, oblivious boolean DEFAULT true, "
        + KEY_PARAMETER,
        RELEASE,
        "server_peeling",
        comment="Peeling: k exponential mechanisms, best first, charged to session_user.",
    ),
    SqlFunction(
        "joint_top_k",
        "_joint_top_k",
        "source regclass, k integer, epsilon double precision, oblivious boolean DEFAULT true, "
        + KEY_PARAMETER,
        RELEASE,
        "server_joint",
        comment="The joint exponential mechanism: an unordered set, so position is the order of "
        "a fresh random permutation, not a rank.",
    ),
    SqlFunction(
        "limited_domain_top_k",
        "_limited_domain_top_k",
        "source regclass, k integer, k_bar integer, epsilon double precision, "
        "delta double precision, oblivious boolean DEFAULT true, " + KEY_PARAMETER,
        RELEASE,
        "server_limited_domain",
        comment="Limited domain: at most k rows; when fewer than k items beat the threshold, a "
        "last row whose item is NULL stands for the bottom symbol.",
    ),
    SqlFunction(
        "last_guarantee",
        "_last_guarantee",
        "",
        "TABLE(epsilon double precision, delta double precision, noise text, "
        "scale double precision, sensitivity double precision, score_bound double precision, "
        "counts_epsilon double precision, counts_scale double precision, count_error bigint, "
        "guarantee text)",
        "server_last_guarantee",
        volatility="VOLATILE",
        comment="The guarantee of the calling session's last release (no row before one): epsilon, "
        "delta, the noise and its scale, the sensitivity it assumes, the score bound, the "
        "counts' share and interval, and the guarantee in words with its derivation.",
        public=True,
    ),
    SqlFunction(
        "my_budget",
        "_my_budget",
        "",
        "TABLE(epsilon double precision, delta double precision, rule text, releases integer, "
        "epsilon_total double precision, delta_total double precision)",
        "server_my_budget",
        comment="What the calling role (session_user) has spent (composed) and its total.",
        public=True,
    ),
    SqlFunction(
        "grant_budget",
        "_grant_budget",
        "role regrole, epsilon double precision, delta double precision DEFAULT 0",
        "void",
        "server_grant_budget",
        volatility="VOLATILE",
        comment="Set a role's privacy budget (its total); what it has spent is kept.",
    ),
    SqlFunction(
        "spent",
        "_spent",
        "role regrole",
        "TABLE(epsilon double precision, delta double precision, rule text, releases integer, "
        "epsilon_total double precision, delta_total double precision)",
        "server_spent",
        comment="What a role has spent (composed) and its total.",
    ),
)


# Signatures of earlier installs, dropped first: a release function with one parameter fewer
# would make every call that omits `oblivious` ambiguous.
SUPERSEDED = (
    "private_top_k(regclass, integer, double precision, double precision, text)",
    "_release(regclass, integer, double precision, double precision, text)",
    "exponential_mechanism(regclass, double precision)",
    "_exponential_mechanism(regclass, double precision)",
    "peeling_top_k(regclass, integer, double precision)",
    "_peeling_top_k(regclass, integer, double precision)",
    "joint_top_k(regclass, integer, double precision)",
    "_joint_top_k(regclass, integer, double precision)",
    "limited_domain_top_k(regclass, integer, integer, double precision, double precision)",
    "_limited_domain_top_k(regclass, integer, integer, double precision, double precision)",
    "private_top_k_with_counts(regclass, integer, double precision, double precision, text, "
    "double precision)",
    "_release_with_counts(regclass, integer, double precision, double precision, text, "
    "double precision)",
)


def _parameters(params: str) -> tuple[str, str]:
    """(the parameters without their defaults, their names) of a parameter list."""
    if not params.strip():
        return "", ""
    bare = [re.sub(r"\s+DEFAULT\s+.*$", "", p.strip()) for p in params.split(",")]
    return ", ".join(bare), ", ".join(p.split()[0] for p in bare)


def _front(f: SqlFunction, params: str, call: str, pins: str, search_path: bool = True) -> str:
    """The plpgsql front: the body's buffer and WAL use kept out of the caller's instrumentation
    (topk._hide_io_begin / _hide_io_end, on the error path too); the project's refusals
    (plpy.Error "topk: ...") raised again as plain SQL errors by topk._refuse (without CONTEXT
    lines); anything else as it came. Both helpers are the library topk_server's where it is
    installed (install.py). Every name in it is qualified or syntax, so it is safe without the
    pinned search_path (`search_path=False`: a text name resolved in the caller's path)."""
    path = "SET search_path = pg_catalog, pg_temp " if search_path else ""
    return f"""
CREATE OR REPLACE FUNCTION topk.{f.name}({params})
RETURNS {f.returns}
LANGUAGE plpgsql {f.volatility} SECURITY DEFINER
{path}{pins}
AS $$
DECLARE
    state pg_catalog.text;
    message pg_catalog.text;
    hint pg_catalog.text;
BEGIN
    PERFORM topk._hide_io_begin();
    {call}
    PERFORM topk._hide_io_end();
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE, message = MESSAGE_TEXT,
        hint = PG_EXCEPTION_HINT;
    PERFORM topk._hide_io_end();
    PERFORM topk._refuse(state, message, hint);
    RAISE;  -- not one of ours: as it came
END
$$;
"""


def function_sql(
    f: SqlFunction, available: Collection[str] | None = None, held: Collection[str] = ()
) -> str:
    """The SQL that installs one SqlFunction (body, front, revokes, comment). A function whose
    first parameter is `source regclass` has one front whose `source` is anycompatible: a
    regclass, or a table's name as text (a string literal resolves to text), so that one
    signature, and one GRANT naming the function alone, covers both. The front resolves the
    name inside, in the caller's search_path, as the superuser owner: an analyst without USAGE
    on the table's schema gets the project's refusal, not the cast's "permission denied for
    schema"."""
    bare, args = _parameters(f.params)
    pins = pinned_clauses(available, held)

    def call(arguments: str) -> str:
        return (
            f"PERFORM topk.{f.body}({arguments});"
            if f.returns == "void"
            else f"RETURN QUERY SELECT * FROM topk.{f.body}({arguments});"
        )

    comment = f.comment.replace("'", "''")
    text = f"""
CREATE OR REPLACE FUNCTION topk.{f.body}({bare})
RETURNS {f.returns}
LANGUAGE plpython3u {f.volatility} SECURITY DEFINER
SET search_path = pg_catalog, pg_temp {pins}
AS $$
{BOOT}
return GD["topk"].{f.server}(plpy, GD{", " if args else ""}{args})
$$;
"""
    front_params, front_bare, front_call = f.params, bare, call(args)
    if f.params.startswith("source regclass"):
        front_params = f.params.replace("source regclass", "source anycompatible", 1)
        front_bare, _ = _parameters(front_params)
        front_call = call(
            args.replace(
                "source",
                "CASE WHEN source IS NULL THEN NULL ELSE coalesce(pg_catalog.to_regclass("
                "source::pg_catalog.text), 0::pg_catalog.regclass) END",
                1,
            )
        )
    # The name is resolved in the caller's search_path (no search_path clause on a front taking
    # a source: every name in it is qualified or syntax).
    text += _front(f, front_params, front_call, pins, search_path=front_bare == bare)
    text += (
        f"REVOKE EXECUTE ON FUNCTION topk.{f.body}({bare}), topk.{f.name}({front_bare}) "
        "FROM PUBLIC;\n"
        f"COMMENT ON FUNCTION topk.{f.name}({front_bare}) IS '{comment}';\n"
    )
    if f.public:
        text += f"GRANT EXECUTE ON FUNCTION topk.{f.name}({front_bare}) TO PUBLIC;\n"
    return text


def install_sql_text(available: Collection[str] | None = None, held: Collection[str] = ()) -> str:
    """install.sql (schema, tables, helpers) followed by every SqlFunction; `available` the
    server's setting names (pg_settings), which pinned_settings() are filtered by; `held` those
    kept at the installing session's value (HELD_SETTINGS_QUERY)."""
    static = (
        resources.files("frontends")
        .joinpath("sql/install.sql")
        .read_text(encoding="utf-8")
        .replace("{BOOT}", BOOT)
    )
    # each superseded front also had a twin taking the table's name as text; and the current
    # functions' fronts took a regclass and, in a twin, a text before their source became
    # anycompatible (one signature for both)
    current = [
        f"{f.name}({_parameters(f.params)[0]})"
        for f in SQL_FUNCTIONS
        if f.params.startswith("source regclass")
    ]
    superseded = [
        *SUPERSEDED,
        *(f.replace("(regclass", "(text", 1) for f in SUPERSEDED),
        *current,
        *(f.replace("(regclass", "(text", 1) for f in current),
        *_keyless(),
    ]
    drops = "".join(f"\nDROP FUNCTION IF EXISTS {SCHEMA}.{f};" for f in dict.fromkeys(superseded))
    functions = "".join(function_sql(f, available, held) for f in SQL_FUNCTIONS)
    return static + _KEEP_GRANTS + drops + functions + _GRANT_AGAIN


def _keyless() -> list[str]:
    """The release functions' signatures before KEY_PARAMETER (body: regclass; front:
    anycompatible), dropped by an install over them."""
    found = []
    for f in SQL_FUNCTIONS:
        if f.params.endswith(", " + KEY_PARAMETER):
            bare = _parameters(f.params.removesuffix(", " + KEY_PARAMETER))[0]
            found += [
                f"{f.body}({bare})",
                f"{f.name}({bare.replace('regclass', 'anycompatible', 1)})",
            ]
    return found


# An install that drops a front of an earlier signature (`superseded`) would drop the EXECUTE
# grants administrators gave on it: they are noted first and given again, by name, on the
# function of that name once it is made (one signature per name).
_KEEP_GRANTS = f"""
DROP TABLE IF EXISTS pg_temp.topk_kept_grants;
CREATE TEMP TABLE topk_kept_grants AS
SELECT DISTINCT p.proname::text AS name, a.grantee::regrole::text AS grantee
FROM pg_proc AS p JOIN pg_namespace AS n ON n.oid = p.pronamespace, aclexplode(p.proacl) AS a
WHERE n.nspname = '{SCHEMA}' AND a.privilege_type = 'EXECUTE' AND a.grantee <> 0
AND a.grantee <> p.proowner;
"""


_GRANT_AGAIN = f"""
DO $$
DECLARE
    kept record;
BEGIN
    FOR kept IN SELECT g.name, g.grantee FROM pg_temp.topk_kept_grants AS g
        WHERE (SELECT count(*) FROM pg_proc AS p WHERE p.proname = g.name
               AND p.pronamespace = '{SCHEMA}'::regnamespace) = 1
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION {SCHEMA}.%I TO %s', kept.name, kept.grantee);
    END LOOP;
END
$$;
DROP TABLE pg_temp.topk_kept_grants;
"""
