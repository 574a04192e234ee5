-- topk_middleware inside PostgreSQL: the schema `topk` (installed by `topk-middleware install-sql`,
-- frontends/sql/install.py; idempotent).
-- The PL/Python bodies call frontends.sql.bodies; their first lines (functions.BOOT,
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
    registered_at timestamptz NOT NULL DEFAULT now(),
    -- the most one client adds to or removes from one count, declared at registration
    sensitivity double precision NOT NULL DEFAULT 1 CHECK (sensitivity > 0)
);
-- The operator's log of refusals whose reason is a fact of the data (NULL, negative or
-- non-finite scores, k above the number of items, ...): the analyst is told only the reference.
CREATE TABLE IF NOT EXISTS topk.refusals (
    reference text PRIMARY KEY,
    refused_at timestamptz NOT NULL DEFAULT now(),
    role text NOT NULL,
    source text NOT NULL,
    detail text NOT NULL
);
ALTER TABLE topk.sources ADD COLUMN IF NOT EXISTS
    sensitivity double precision NOT NULL DEFAULT 1 CHECK (sensitivity > 0);
-- the seconds an oblivious release from the table is padded to (NULL: the cost model's)
ALTER TABLE topk.sources ADD COLUMN IF NOT EXISTS
    deadline double precision CHECK (deadline > 0);
CREATE INDEX IF NOT EXISTS refusals_by_role ON topk.refusals (role, refused_at);
-- Who may release from a registered table: a role (and its members), or every role (grantee 0,
-- granted TO PUBLIC). A role's OID: a role dropped and created again under its name holds
-- nothing, and a renamed role keeps its grants.
CREATE TABLE IF NOT EXISTS topk.source_grants (
    source regclass NOT NULL REFERENCES topk.sources (source) ON DELETE CASCADE,
    grantee oid NOT NULL,
    granted_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (source, grantee)
);
REVOKE ALL ON topk.settings, topk.sources, topk.refusals, topk.source_grants FROM PUBLIC;

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

-- What analysts and administrators call (functions.SQL_FUNCTIONS, appended by install-sql):
-- plpgsql fronts over PL/Python bodies (topk._*). A front hands every error of its body to
-- topk._refuse, which raises a refusal of the project (plpy.Error "topk: ...") again as a plain
-- SQL error with its SQLSTATE, message and hint, without PL/Python's exception name and traceback,
-- and returns on anything else (the front re-raises it as it came). This is its PL/pgSQL form,
-- whose errors carry the CONTEXT lines PL/pgSQL adds; install-sql replaces it with the C form of
-- the library topk_server (frontends/sql/server), which drops them, where the server has it.
CREATE OR REPLACE FUNCTION topk._refuse(state text, message text, hint text)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF message NOT LIKE 'plpy.Error: topk: %' THEN
        RETURN;
    END IF;
    IF coalesce(hint, '') = '' THEN
        RAISE EXCEPTION USING ERRCODE = state, MESSAGE = substr(message, 13);
    END IF;
    RAISE EXCEPTION USING ERRCODE = state, MESSAGE = substr(message, 13), HINT = hint;
END
$$;
DROP FUNCTION IF EXISTS topk._plain_refusal(text, text, text);

-- Every front calls topk._hide_io_begin() before its body and topk._hide_io_end() after it. In
-- the C form of the library topk_server they keep the body's buffer and WAL use out of the
-- caller's EXPLAIN (ANALYZE, BUFFERS, WAL) and pg_stat_statements; these PL/pgSQL forms, what a
-- server without the library keeps, do nothing.
CREATE OR REPLACE FUNCTION topk._hide_io_begin()
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$ BEGIN END $$;
CREATE OR REPLACE FUNCTION topk._hide_io_end()
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$ BEGIN END $$;

-- topk.grant_source('public.t', 'alice') lets alice (and the members of alice) release from a
-- registered table; 'PUBLIC' lets every role. topk.revoke_source undoes one such grant.
CREATE OR REPLACE FUNCTION topk.grant_source(source regclass, grantee text)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM topk.sources AS s WHERE s.source = $1) THEN
        RAISE EXCEPTION 'topk: table % is not registered for private top-k', $1
            USING ERRCODE = '42704',
            HINT = 'topk-middleware install-sql --dsn ... --source <table> registers it';
    END IF;
    DELETE FROM topk.source_grants AS g  -- grants of roles dropped since
    WHERE g.grantee <> 0 AND NOT EXISTS (SELECT 1 FROM pg_roles AS r WHERE r.oid = g.grantee);
    INSERT INTO topk.source_grants (source, grantee)
    VALUES ($1, CASE WHEN upper($2) = 'PUBLIC' THEN 0 ELSE $2::regrole::oid END)
    ON CONFLICT DO NOTHING;
END
$$;
CREATE OR REPLACE FUNCTION topk.revoke_source(source regclass, grantee text)
RETURNS boolean
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    DELETE FROM topk.source_grants AS g WHERE g.source = $1
    AND g.grantee = CASE WHEN upper($2) = 'PUBLIC' THEN 0 ELSE $2::regrole::oid END
    RETURNING true
$$;

-- The ledger's principal of a role (topk.topk_ledger_*.principal): its OID, so that a role
-- dropped and created again under its name holds no budget, and a renamed role keeps its own.
CREATE OR REPLACE FUNCTION topk.principal(role regrole)
RETURNS text
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT 'role:' || $1::oid::text $$;

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

-- Explicit even with the default privileges above: those apply to functions created after them,
-- and CREATE OR REPLACE keeps the grants of a function an older install created.
REVOKE EXECUTE ON FUNCTION topk._refuse(text, text, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION topk._hide_io_begin(), topk._hide_io_end() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION topk.unregister_source(regclass), topk.principal(regrole) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION topk.grant_source(regclass, text), topk.revoke_source(regclass, text)
    FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION topk._check() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION topk._forget_dropped() FROM PUBLIC;
