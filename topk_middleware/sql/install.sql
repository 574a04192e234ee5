-- topk_middleware inside PostgreSQL: the schema `topk` (installed by `topk-middleware install-sql`,
-- topk_middleware/sql_function.py; idempotent).
-- The PL/Python bodies call topk_middleware.sql_function; their first lines (sql_function.BOOT,
-- put in by install-sql) make the project importable once per session (topk.settings: the checkout and the virtual environment's site-packages).
CREATE EXTENSION IF NOT EXISTS plpython3u;
CREATE SCHEMA IF NOT EXISTS topk;
-- Analysts may look into the schema (to call what they are granted), and nothing else by default.
REVOKE ALL ON SCHEMA topk FROM PUBLIC;
GRANT USAGE ON SCHEMA topk TO PUBLIC;
ALTER DEFAULT PRIVILEGES IN SCHEMA topk REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC;

CREATE TABLE IF NOT EXISTS topk.settings (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    project_path text NOT NULL,   -- put first on the server Python's sys.path
    site_packages text NOT NULL,  -- site.addsitedir: dependencies, .pth files (editable installs)
    ledger_dsn text NOT NULL      -- libpq DSN of the ledger's own connection (autonomous commits)
);
CREATE TABLE IF NOT EXISTS topk.sources (
    source regclass PRIMARY KEY,
    id_column name NOT NULL,
    score_column name NOT NULL,
    position_table regclass NOT NULL,  -- live mode (adapters/postgres_live.py)
    trigger_prefix text NOT NULL,
    registered_at timestamptz NOT NULL DEFAULT now()
);
REVOKE ALL ON topk.settings, topk.sources FROM PUBLIC;

-- A dropped table (or its position table) leaves the registry at once: an OID reused by a later
-- table must never find a registration.
CREATE OR REPLACE FUNCTION topk._forget_dropped()
RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    DELETE FROM topk.sources AS s USING pg_event_trigger_dropped_objects() AS d
    WHERE d.classid = 'pg_class'::regclass AND d.objid IN (s.source, s.position_table);
END
$$;
DROP EVENT TRIGGER IF EXISTS topk_forget_dropped_sources;
CREATE EVENT TRIGGER topk_forget_dropped_sources ON sql_drop
    EXECUTE FUNCTION topk._forget_dropped();
DELETE FROM topk.sources AS s  -- registrations of tables dropped before the trigger existed
WHERE NOT EXISTS (SELECT 1 FROM pg_class WHERE oid = s.source)
   OR NOT EXISTS (SELECT 1 FROM pg_class WHERE oid = s.position_table);

-- The release: STABLE, so every SPI query of the call runs in the calling statement's snapshot;
-- its writes (the charge, the log) go through the ledger's own connection, committed at once.
CREATE OR REPLACE FUNCTION topk._release(
    source regclass, k integer, epsilon double precision, delta double precision, noise text)
RETURNS TABLE("position" integer, item text)
LANGUAGE plpython3u STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp SET jit = off
AS $$
{BOOT}
return GD["topk"].server_release(plpy, GD, source, k, epsilon, delta, noise)
$$;

-- What analysts and administrators call: plpgsql fronts over the PL/Python bodies (topk._*),
-- which turn a refusal of the project (plpy.error "topk: ...") into a plain SQL error with its
-- SQLSTATE, message and hint, without PL/Python's exception name and traceback.
CREATE OR REPLACE FUNCTION topk._plain_refusal(state text, message text, hint text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF message NOT LIKE 'plpy.Error: topk: %' THEN
        RETURN;  -- not a refusal of ours: the caller re-raises it as it came
    END IF;
    IF coalesce(hint, '') = '' THEN
        RAISE EXCEPTION USING ERRCODE = state, MESSAGE = substr(message, 13);
    END IF;
    RAISE EXCEPTION USING ERRCODE = state, MESSAGE = substr(message, 13), HINT = hint;
END
$$;

CREATE OR REPLACE FUNCTION topk.private_top_k(
    source regclass, k integer, epsilon double precision,
    delta double precision DEFAULT 0, noise text DEFAULT 'gumbel')
RETURNS TABLE("position" integer, item text)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    state text;
    message text;
    hint text;
BEGIN
    RETURN QUERY
        SELECT r."position", r.item FROM topk._release(source, k, epsilon, delta, noise) AS r;
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE, message = MESSAGE_TEXT,
        hint = PG_EXCEPTION_HINT;
    PERFORM topk._plain_refusal(state, message, hint);
    RAISE;  -- not one of ours: as it came
END
$$;

-- The other mechanisms of topk_middleware/mechanisms that fit a table function: the same
-- registration check, the same durable charge (each mechanism's own cost, through its budget=).
CREATE OR REPLACE FUNCTION topk._exponential_mechanism(
    source regclass, epsilon double precision)
RETURNS TABLE("position" integer, item text)
LANGUAGE plpython3u STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp SET jit = off
AS $$
{BOOT}
return GD["topk"].server_exponential(plpy, GD, source, epsilon)
$$;

CREATE OR REPLACE FUNCTION topk.exponential_mechanism(
    source regclass, epsilon double precision)
RETURNS TABLE("position" integer, item text)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    state text;
    message text;
    hint text;
BEGIN
    RETURN QUERY
        SELECT r."position", r.item FROM topk._exponential_mechanism(source, epsilon) AS r;
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE, message = MESSAGE_TEXT,
        hint = PG_EXCEPTION_HINT;
    PERFORM topk._plain_refusal(state, message, hint);
    RAISE;  -- not one of ours: as it came
END
$$;

CREATE OR REPLACE FUNCTION topk._peeling_top_k(
    source regclass, k integer, epsilon double precision)
RETURNS TABLE("position" integer, item text)
LANGUAGE plpython3u STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp SET jit = off
AS $$
{BOOT}
return GD["topk"].server_peeling(plpy, GD, source, k, epsilon)
$$;

CREATE OR REPLACE FUNCTION topk.peeling_top_k(
    source regclass, k integer, epsilon double precision)
RETURNS TABLE("position" integer, item text)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    state text;
    message text;
    hint text;
BEGIN
    RETURN QUERY
        SELECT r."position", r.item FROM topk._peeling_top_k(source, k, epsilon) AS r;
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE, message = MESSAGE_TEXT,
        hint = PG_EXCEPTION_HINT;
    PERFORM topk._plain_refusal(state, message, hint);
    RAISE;  -- not one of ours: as it came
END
$$;

CREATE OR REPLACE FUNCTION topk._joint_top_k(
    source regclass, k integer, epsilon double precision)
RETURNS TABLE("position" integer, item text)
LANGUAGE plpython3u STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp SET jit = off
AS $$
{BOOT}
return GD["topk"].server_joint(plpy, GD, source, k, epsilon)
$$;

-- An unordered set: "position" is the order of a fresh random permutation, not a rank.
CREATE OR REPLACE FUNCTION topk.joint_top_k(
    source regclass, k integer, epsilon double precision)
RETURNS TABLE("position" integer, item text)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    state text;
    message text;
    hint text;
BEGIN
    RETURN QUERY
        SELECT r."position", r.item FROM topk._joint_top_k(source, k, epsilon) AS r;
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE, message = MESSAGE_TEXT,
        hint = PG_EXCEPTION_HINT;
    PERFORM topk._plain_refusal(state, message, hint);
    RAISE;  -- not one of ours: as it came
END
$$;

CREATE OR REPLACE FUNCTION topk._limited_domain_top_k(
    source regclass, k integer, k_bar integer, epsilon double precision,
    delta double precision)
RETURNS TABLE("position" integer, item text)
LANGUAGE plpython3u STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp SET jit = off
AS $$
{BOOT}
return GD["topk"].server_limited_domain(plpy, GD, source, k, k_bar, epsilon, delta)
$$;

-- At most k rows; when fewer than k items beat the threshold, the release ends with the
-- bottom symbol: a last row whose item is NULL.
CREATE OR REPLACE FUNCTION topk.limited_domain_top_k(
    source regclass, k integer, k_bar integer, epsilon double precision,
    delta double precision)
RETURNS TABLE("position" integer, item text)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    state text;
    message text;
    hint text;
BEGIN
    RETURN QUERY
        SELECT r."position", r.item FROM topk._limited_domain_top_k(source, k, k_bar, epsilon, delta) AS r;
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE, message = MESSAGE_TEXT,
        hint = PG_EXCEPTION_HINT;
    PERFORM topk._plain_refusal(state, message, hint);
    RAISE;  -- not one of ours: as it came
END
$$;

CREATE OR REPLACE FUNCTION topk._grant_budget(
    role regrole, epsilon double precision, delta double precision)
RETURNS void
LANGUAGE plpython3u VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp SET jit = off
AS $$
{BOOT}
GD["topk"].server_grant_budget(plpy, GD, role, epsilon, delta)
$$;

CREATE OR REPLACE FUNCTION topk.grant_budget(
    role regrole, epsilon double precision, delta double precision DEFAULT 0)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    state text;
    message text;
    hint text;
BEGIN
    PERFORM topk._grant_budget(role, epsilon, delta);
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE, message = MESSAGE_TEXT,
        hint = PG_EXCEPTION_HINT;
    PERFORM topk._plain_refusal(state, message, hint);
    RAISE;  -- not one of ours: as it came
END
$$;

CREATE OR REPLACE FUNCTION topk._spent(
    role regrole)
RETURNS TABLE(epsilon double precision, delta double precision, rule text, releases integer,
              epsilon_total double precision, delta_total double precision)
LANGUAGE plpython3u STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp SET jit = off
AS $$
{BOOT}
return GD["topk"].server_spent(plpy, GD, role)
$$;

CREATE OR REPLACE FUNCTION topk.spent(
    role regrole)
RETURNS TABLE(epsilon double precision, delta double precision, rule text, releases integer,
              epsilon_total double precision, delta_total double precision)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    state text;
    message text;
    hint text;
BEGIN
    RETURN QUERY SELECT s.epsilon, s.delta, s.rule, s.releases, s.epsilon_total,
        s.delta_total FROM topk._spent(role) AS s;
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE, message = MESSAGE_TEXT,
        hint = PG_EXCEPTION_HINT;
    PERFORM topk._plain_refusal(state, message, hint);
    RAISE;  -- not one of ours: as it came
END
$$;

CREATE OR REPLACE FUNCTION topk.unregister_source(source regclass)
RETURNS boolean
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$ DELETE FROM topk.sources WHERE topk.sources.source = $1 RETURNING true $$;

-- Used by install-sql: imports the project in the server and opens the ledger (creating its
-- tables in schema topk); returns what it found.
CREATE OR REPLACE FUNCTION topk._check()
RETURNS text
LANGUAGE plpython3u VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
{BOOT}
return GD["topk"].server_check(plpy, GD)
$$;

REVOKE EXECUTE ON FUNCTION topk.private_top_k(regclass, integer, double precision,
    double precision, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION topk._release(regclass, integer, double precision,
    double precision, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION topk.grant_budget(regrole, double precision, double precision)
    FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION topk.spent(regrole) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION topk.unregister_source(regclass) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION topk._check() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION topk._forget_dropped() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION topk.exponential_mechanism(regclass, double precision) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION topk._exponential_mechanism(regclass, double precision) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION topk.peeling_top_k(regclass, integer, double precision) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION topk._peeling_top_k(regclass, integer, double precision) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION topk.joint_top_k(regclass, integer, double precision) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION topk._joint_top_k(regclass, integer, double precision) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION topk.limited_domain_top_k(regclass, integer, integer, double precision,
    double precision) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION topk._limited_domain_top_k(regclass, integer, integer, double precision,
    double precision) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION topk._grant_budget(regrole, double precision, double precision)
    FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION topk._spent(regrole) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION topk._plain_refusal(text, text, text) FROM PUBLIC;
