-- Who may read what (docs/security.md): a person's job env values are readable by that person,
-- the admins and the nodes that run it, and no one else. People read the log with their own
-- logins (members of corral_person, made by `corral user add`); `corral jobs`, `why` and `show`
-- must keep working for everyone's jobs, so rows are not hidden: the values of `spec.env` of a
-- JobSubmitted are, unless the reader is the job's user (the names stay: they say what a job
-- expects; the values are where secrets go).
--
-- - person_view.events: the events table as a person reads it, a security-barrier view owned by
--   corral_owner: env values of other people's submissions read "(hidden)", and no `hash` (with
--   the previous row's hash it would check a guessed value offline). corral_person loses SELECT on
--   public.events; its logins find the view first on their search_path (set by
--   corral.stack.pglogins), so the CLI's unqualified `events` is the view for them.
-- - view_snapshots / view_jobs (the read model) hold every job's spec: the projector now stores
--   env values hidden (corral.readmodel.codec), and the rows stored before are deleted here (they
--   are derived: the next reader folds the log, and the projector writes them again).
-- Auditors and the admin's CLI (corral_reader) read the log as it is (`corral audit verify`).

-- The group may not exist yet if this runs before 070 on a database restored from elsewhere.
DO $$ BEGIN CREATE ROLE corral_person NOLOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS;
EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$;

CREATE SCHEMA IF NOT EXISTS person_view;
ALTER SCHEMA person_view OWNER TO corral_owner;
REVOKE ALL ON SCHEMA person_view FROM PUBLIC;
GRANT USAGE ON SCHEMA person_view TO corral_person;

-- `<database>_u_<name>`: the login of person `name` in this database, as corral.stack.pglogins
-- names it (person_login): both must change together.
CREATE OR REPLACE FUNCTION person_view.login_of(name text) RETURNS text LANGUAGE sql STABLE AS $$
    SELECT (CASE WHEN length(d.db) > 28
                 THEN substr(d.db, 1, 17) || '_' || substr(encode(sha256(convert_to(current_database(), 'UTF8')), 'hex'), 1, 10)
                 ELSE d.db END)
           || '_u_' || regexp_replace(lower(name), '[^a-z0-9_]', '_', 'g')
    FROM (SELECT regexp_replace(lower(current_database()), '[^a-z0-9_]', '_', 'g') AS db) AS d
$$;
ALTER FUNCTION person_view.login_of(text) OWNER TO corral_owner;

CREATE OR REPLACE VIEW person_view.events WITH (security_barrier) AS
SELECT e.stream, e.version, e.position, e.event_id, e.type, e.schema_version,
       CASE WHEN e.type = 'JobSubmitted' AND json_typeof(e.data -> 'spec' -> 'env') = 'object'
                 AND person_view.login_of(coalesce(e.data ->> 'user', '')) IS DISTINCT FROM current_user::text
            THEN jsonb_set(e.data::jsonb, '{spec,env}',
                           coalesce((SELECT jsonb_object_agg(k, '(hidden)'::text)
                                     FROM json_object_keys(e.data -> 'spec' -> 'env') AS k), '{}'::jsonb))::json
            ELSE e.data END AS data,
       e.correlation_id, e.causation_id, e.occurred_at, e.recorded_at, NULL::bytea AS hash, e.trace_context
FROM public.events AS e;
ALTER VIEW person_view.events OWNER TO corral_owner;

REVOKE SELECT ON public.events FROM corral_person;
GRANT SELECT ON person_view.events TO corral_person;

DELETE FROM view_jobs;
DELETE FROM view_snapshots;
