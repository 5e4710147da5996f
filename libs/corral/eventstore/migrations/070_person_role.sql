-- People's own Postgres logins: one per person or pipeline (`<db>_u_<name>`, made by `corral user
-- add`, see corral.stack.pglogins), each a member of corral_person and of nothing else. Read rights
-- as corral_reader's, granted table by table so that they can be narrowed for people alone.
DO $$ BEGIN CREATE ROLE corral_person NOLOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS;
EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$;

GRANT SELECT ON events, event_log_head, consumer_tracking, consumer_checkpoints, relay_positions, allocations,
    schema_migrations, view_snapshots, view_jobs TO corral_person;
