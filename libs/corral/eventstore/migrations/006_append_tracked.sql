-- `corral_append` for a batch of consumed messages: one append, one tracking row per message.
--
-- Why: a service handling its inbox one message at a time committed once per message (and a
-- commit, with its fsync, was the log's limit under load). Handling a fetched batch together
-- needs the effects of all its messages and all their tracking rows in ONE transaction, so that
-- either every message of the batch counts as handled or none does (exactly-once is kept).
--
-- Same checks and results as `corral_append` (005), except:
--   'already_processed'  at least one of the tracking keys is recorded already: nothing is
--                        written, and the caller handles the messages one by one instead
--                        (each then learns on its own whether it was handled before);
-- and the head lock is taken whenever there is anything to write (events or tracking rows), so
-- batches never interleave. A tracking row recorded concurrently by a tracking-only
-- `corral_append` (which does not take the lock) aborts the whole statement (SQLSTATE CR001),
-- which the caller treats like 'already_processed'.

CREATE FUNCTION corral_append_tracked(
    streams text[], expected integer[], counts integer[],
    event_ids text[], types text[], schema_versions integer[], payloads text[],
    correlation_ids text[], causation_ids text[], occurred_ats timestamptz[],
    tracking_consumer text, tracking_keys text[],
    OUT status text, OUT versions integer[],
    OUT conflict_stream text, OUT conflict_expected integer, OUT conflict_actual integer)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    total    integer := coalesce(array_length(event_ids, 1), 0);
    n        integer := coalesce(array_length(streams, 1), 0);
    ntrack   integer := coalesce(array_length(tracking_keys, 1), 0);
    last     bigint;
    current  integer[];
    inserted integer;
BEGIN
    SELECT h.position INTO last FROM event_log_head h WHERE h.id FOR UPDATE;

    IF ntrack > 0 AND EXISTS (
        SELECT 1 FROM consumer_tracking t WHERE t.consumer = tracking_consumer AND t.key = ANY (tracking_keys)
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

    IF ntrack > 0 THEN
        INSERT INTO consumer_tracking (consumer, key)
            SELECT DISTINCT tracking_consumer, k FROM unnest(tracking_keys) AS k
            ON CONFLICT DO NOTHING;
        GET DIAGNOSTICS inserted = ROW_COUNT;
        IF inserted < (SELECT count(DISTINCT k) FROM unnest(tracking_keys) AS k) THEN
            RAISE EXCEPTION 'a tracking key of % was recorded concurrently', tracking_consumer
                USING ERRCODE = 'CR001';
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
