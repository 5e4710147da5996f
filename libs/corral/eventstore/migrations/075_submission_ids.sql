-- The job a user's submission id created, found without reading the log.
--
-- A submission id is scoped to its user: a resubmission of the same (user, submission id) is a
-- duplicate that admission records as handled and nothing more, and the client answers with the
-- job the first one created (`EventStore.job_of_submission`, whose expressions these are). A
-- recorded submission without a user is the empty user's. Only JobSubmitted rows are indexed.
CREATE INDEX events_submission_ids ON events (
    (coalesce(data->>'user', '')),
    (coalesce(data->>'submission_id', data->'spec'->>'submission_id')),
    position
) WHERE type = 'JobSubmitted';
