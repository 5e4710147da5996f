-- Least privilege: who may do what to the log (issue 12).
--
-- Before this, every service connected as a superuser: `SET session_replication_role = replica`
-- or `ALTER TABLE events DISABLE TRIGGER` bypassed the append-only trigger, and `COPY ... TO
-- PROGRAM` ran OS commands. Three roles (cluster-wide, created once; grants are per database):
-- - corral_owner   (NOLOGIN): owns the tables; only migrations act as it.
-- - corral_service: what the services need — SELECT/INSERT on events and nothing else there (no
--   UPDATE, DELETE, TRUNCATE; not a superuser, so no session_replication_role, no trigger
--   changes, no COPY TO PROGRAM); the bookkeeping tables as each needs them.
-- - corral_reader:  SELECT only, for the CLI and auditors.
-- A login (with a scram password) is granted one of them: `CREATE ROLE x LOGIN PASSWORD '...'
-- IN ROLE corral_service`. Tables added by later migrations need their own GRANTs.

-- Each CREATE ROLE in its own block: two databases migrating at once may race to create them.
DO $$ BEGIN CREATE ROLE corral_owner NOLOGIN;
EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$;
DO $$ BEGIN CREATE ROLE corral_service NOLOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS;
EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$;
DO $$ BEGIN CREATE ROLE corral_reader NOLOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS;
EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$;

ALTER TABLE events OWNER TO corral_owner;
ALTER TABLE event_log_head OWNER TO corral_owner;
ALTER TABLE consumer_tracking OWNER TO corral_owner;
ALTER TABLE consumer_checkpoints OWNER TO corral_owner;
ALTER TABLE relay_positions OWNER TO corral_owner;
ALTER TABLE allocations OWNER TO corral_owner;

REVOKE ALL ON events, event_log_head, consumer_tracking, consumer_checkpoints, relay_positions, allocations
    FROM PUBLIC;

GRANT SELECT, INSERT ON events TO corral_service;
GRANT SELECT, UPDATE ON event_log_head TO corral_service;
GRANT SELECT, INSERT ON consumer_tracking TO corral_service;
GRANT SELECT, INSERT, UPDATE ON consumer_checkpoints TO corral_service;
GRANT SELECT, INSERT, UPDATE ON relay_positions TO corral_service;
GRANT SELECT, INSERT, UPDATE ON allocations TO corral_service;
GRANT SELECT ON schema_migrations TO corral_service, corral_reader;

GRANT SELECT ON events, event_log_head, consumer_tracking, consumer_checkpoints, relay_positions, allocations
    TO corral_reader;
