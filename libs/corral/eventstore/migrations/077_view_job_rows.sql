-- Every job of the read model is a row of view_jobs, active or over (corral.readmodel.codec): the
-- snapshot keeps the nodes, queues and ports only, so `corral show JOB` reads one row and `corral
-- jobs` one page of rows however many jobs wait. A listing filters on the queue and the user and
-- pages in submission order, oldest first (ties by id, byte order, as Python sorts them).
-- Derived data: rows of the old layout are deleted (the next reader folds the log, the projector
-- writes them again).

DELETE FROM view_jobs;
DELETE FROM view_snapshots;
ALTER TABLE view_jobs ADD COLUMN queue text, ADD COLUMN user_name text;
CREATE INDEX view_jobs_page ON view_jobs (schema, submitted_at, job_id COLLATE "C");
