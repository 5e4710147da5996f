-- Read models for the CLI (issue 18): `corral jobs|nodes|queues|why` folded the whole log on every
-- call (~20 us per event: ~20 s at 1M events). A projector (corral.readmodel.projector, run under a
-- lease by the services) keeps the folded view here; the CLI reads it and folds only the events
-- after its position (corral.readmodel.snapshots).
--
-- - view_snapshots: one row per projection schema (`schema`, a hash of the code that folds and
--   encodes the view: a code change starts a new row and the old one is never read). `position`
--   is the last log position folded into `data`: the view of every job still active (not over,
--   or over but holding GPUs or quota), every node and queue, msgspec-encoded.
-- - view_jobs: every job that was no longer active at some snapshot, as of `position` (written in
--   the same transaction as the snapshot at that position, by the projector that wrote the
--   snapshot before it: see corral.readmodel.snapshots.write_view).
-- Both are derived: deleting them only makes the next CLI call fold the whole log again.

CREATE TABLE view_snapshots (
    schema      text        PRIMARY KEY,
    position    bigint      NOT NULL CHECK (position >= 0),
    data        bytea       NOT NULL,
    written_at  timestamptz NOT NULL DEFAULT now()
);
-- msgpack does not compress much and is rewritten every second or so: spare Postgres the pglz work.
ALTER TABLE view_snapshots ALTER COLUMN data SET STORAGE EXTERNAL;

CREATE TABLE view_jobs (
    schema        text        NOT NULL,
    job_id        text        NOT NULL,
    position      bigint      NOT NULL CHECK (position >= 0),
    state         text        NOT NULL,
    submitted_at  timestamptz,
    data          bytea       NOT NULL,
    PRIMARY KEY (schema, job_id)
);
CREATE INDEX view_jobs_state ON view_jobs (schema, state);

ALTER TABLE view_snapshots OWNER TO corral_owner;
ALTER TABLE view_jobs OWNER TO corral_owner;
REVOKE ALL ON view_snapshots, view_jobs FROM PUBLIC;
-- The projector runs in the service processes (their logins are in corral_service); the CLI reads.
GRANT SELECT, INSERT, UPDATE, DELETE ON view_snapshots, view_jobs TO corral_service;
GRANT SELECT ON view_snapshots, view_jobs TO corral_reader;
