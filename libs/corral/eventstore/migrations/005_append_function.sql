-- The whole append as one server-side function, called as a single autocommit statement.
--
-- Why: appends are serialised by the row lock on event_log_head (see corral/eventstore/store.py),
-- so every moment between taking that lock and committing is paid by all appenders. Running the
-- checks and inserts inside the database removes client round trips (and client scheduling delays)
-- from that critical section: it lasts one function execution plus the commit.
--
-- Inside a VOLATILE function every statement takes a fresh snapshot, so after waiting for the head
-- lock the version and tracking checks see everything the previous appender committed.
--
-- Nothing is written unless all checks pass, so a non-'ok' status needs no rollback:
--   'already_processed'  the tracking key (consumer, key) is already recorded
--   'conflict'           conflict_* name the first stream whose version is not the expected one
--   'duplicate'          some event id is already stored (the caller decides: replay or error)
--   'ok'                 versions[i] is streams[i]'s version after the append
-- expected[i] < 0 means "any version". counts[i] events of the flat event arrays belong to streams[i].

CREATE FUNCTION corral_append(
    streams text[], expected integer[], counts integer[],
    event_ids text[], types text[], schema_versions integer[], payloads text[],
    correlation_ids text[], causation_ids text[], occurred_ats timestamptz[],
    tracking_consumer text, tracking_key text,
    OUT status text, OUT versions integer[],
    OUT conflict_stream text, OUT conflict_expected integer, OUT conflict_actual integer)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    total   integer := coalesce(array_length(event_ids, 1), 0);
    n       integer := coalesce(array_length(streams, 1), 0);
    last    bigint;
    current integer[];
BEGIN
    IF total > 0 THEN
        SELECT h.position INTO last FROM event_log_head h WHERE h.id FOR UPDATE;
    END IF;

    IF tracking_consumer IS NOT NULL AND EXISTS (
        SELECT 1 FROM consumer_tracking t WHERE t.consumer = tracking_consumer AND t.key = tracking_key
    ) THEN
        status := 'already_processed';
        RETURN;
    END IF;

    SELECT array_agg(coalesce((SELECT max(e.version) FROM events e WHERE e.stream = s.name), 0)
                     ORDER BY s.ord)
      INTO current
      FROM unnest(streams) WITH ORDINALITY AS s(name, ord);

    FOR i IN 1 .. n LOOP
        IF expected[i] >= 0 AND expected[i] <> current[i] THEN
            status := 'conflict';
            conflict_stream := streams[i];
            conflict_expected := expected[i];
            conflict_actual := current[i];
            RETURN;
        END IF;
    END LOOP;

    IF total > 0 AND EXISTS (SELECT 1 FROM events e WHERE e.event_id = ANY (event_ids)) THEN
        status := 'duplicate';
        RETURN;
    END IF;

    IF tracking_consumer IS NOT NULL THEN
        INSERT INTO consumer_tracking (consumer, key) VALUES (tracking_consumer, tracking_key)
            ON CONFLICT DO NOTHING;
        IF NOT FOUND THEN  -- a concurrent tracking-only append recorded it first
            status := 'already_processed';
            RETURN;
        END IF;
    END IF;

    IF total > 0 THEN
        INSERT INTO events (stream, version, position, event_id, type, schema_version, data,
                            correlation_id, causation_id, occurred_at)
        SELECT slot.stream, slot.version, last + ev.ord, ev.event_id, ev.type, ev.schema_version,
               ev.payload::json, ev.correlation_id, ev.causation_id, ev.occurred_at
          FROM unnest(event_ids, types, schema_versions, payloads, correlation_ids, causation_ids,
                      occurred_ats)
               WITH ORDINALITY AS ev(event_id, type, schema_version, payload, correlation_id,
                                     causation_id, occurred_at, ord)
          JOIN (SELECT s.name AS stream, current[s.ord] + g.k AS version,
                       row_number() OVER (ORDER BY s.ord, g.k) AS ord
                  FROM unnest(streams, counts) WITH ORDINALITY AS s(name, cnt, ord),
                       generate_series(1, s.cnt) AS g(k)) AS slot
            ON slot.ord = ev.ord;
        UPDATE event_log_head SET position = last + total WHERE id;
        PERFORM pg_notify('corral_events', (last + total)::text);
    END IF;

    SELECT array_agg(current[s.ord] + s.cnt ORDER BY s.ord)
      INTO versions
      FROM unnest(streams, counts) WITH ORDINALITY AS s(name, cnt, ord);
    status := 'ok';
END;
$$;
