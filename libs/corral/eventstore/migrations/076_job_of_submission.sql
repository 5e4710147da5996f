-- The job a user's submission id created, as one function (`EventStore.job_of_submission`), so
-- that a person's login gets it from the index of 075 too: a person reads `person_view.events`
-- (072), whose `data` is an expression no index of public.events serves, and a lookup through it
-- read the whole log. `job_of_submission` resolves by search_path like a table: a person's login
-- finds person_view's (SECURITY DEFINER, owned by corral_owner: it reads public.events and returns
-- only a job id, which every reader sees in `corral jobs` anyway); every other login public's.

CREATE OR REPLACE FUNCTION public.job_of_submission(who text, submission text) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT data->>'job_id' FROM public.events WHERE type = 'JobSubmitted'
       AND coalesce(data->>'user', '') = who
       AND coalesce(data->>'submission_id', data->'spec'->>'submission_id') = submission
     ORDER BY position LIMIT 1
$$;
ALTER FUNCTION public.job_of_submission(text, text) OWNER TO corral_owner;

CREATE OR REPLACE FUNCTION person_view.job_of_submission(who text, submission text) RETURNS text
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, public AS $$
    SELECT public.job_of_submission(who, submission)
$$;
ALTER FUNCTION person_view.job_of_submission(text, text) OWNER TO corral_owner;
REVOKE ALL ON FUNCTION person_view.job_of_submission(text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION person_view.job_of_submission(text, text) TO corral_person;
