-- Each event's W3C trace context (`traceparent`), so that the outbox relay publishes it and every
-- consumer continues the job's trace (corral.telemetry.tracing; issue 17).
--
-- It is telemetry about the append, not part of the event: NULL unless the appending process
-- traces, outside `data`, and outside the hash chain's canonical text (051), so tracing on or
-- off never changes what the log says or how it verifies.
--
-- How it gets there without touching the append functions (005, 006): the `_traced` variants
-- put a JSON object {event_id: traceparent} in the transaction-local setting `corral.trace` and
-- call the plain function in the same statement; a trigger copies each inserted event's entry.
-- The trigger's WHEN clause reads the setting only, so an append that traces nothing (the
-- default) does not even call it.

ALTER TABLE events ADD COLUMN trace_context text;

CREATE FUNCTION events_trace_context() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.trace_context := current_setting('corral.trace', true)::json ->> NEW.event_id;
    RETURN NEW;
END
$$;

CREATE TRIGGER events_trace BEFORE INSERT ON events FOR EACH ROW
    WHEN (coalesce(current_setting('corral.trace', true), '') <> '')
    EXECUTE FUNCTION events_trace_context();

CREATE FUNCTION corral_append_traced(
    streams text[], expected integer[], counts integer[],
    event_ids text[], types text[], schema_versions integer[], payloads text[],
    correlation_ids text[], causation_ids text[], occurred_ats timestamptz[],
    tracking_consumer text, tracking_key text, traces text,
    OUT status text, OUT versions integer[],
    OUT conflict_stream text, OUT conflict_expected integer, OUT conflict_actual integer)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM set_config('corral.trace', coalesce(traces, ''), true);
    SELECT a.status, a.versions, a.conflict_stream, a.conflict_expected, a.conflict_actual
      INTO status, versions, conflict_stream, conflict_expected, conflict_actual
      FROM corral_append(streams, expected, counts, event_ids, types, schema_versions, payloads,
                         correlation_ids, causation_ids, occurred_ats, tracking_consumer, tracking_key) a;
    PERFORM set_config('corral.trace', '', true);
END;
$$;

CREATE FUNCTION corral_append_tracked_traced(
    streams text[], expected integer[], counts integer[],
    event_ids text[], types text[], schema_versions integer[], payloads text[],
    correlation_ids text[], causation_ids text[], occurred_ats timestamptz[],
    tracking_consumer text, tracking_keys text[], traces text,
    OUT status text, OUT versions integer[],
    OUT conflict_stream text, OUT conflict_expected integer, OUT conflict_actual integer)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM set_config('corral.trace', coalesce(traces, ''), true);
    SELECT a.status, a.versions, a.conflict_stream, a.conflict_expected, a.conflict_actual
      INTO status, versions, conflict_stream, conflict_expected, conflict_actual
      FROM corral_append_tracked(streams, expected, counts, event_ids, types, schema_versions, payloads,
                                 correlation_ids, causation_ids, occurred_ats, tracking_consumer,
                                 tracking_keys) a;
    PERFORM set_config('corral.trace', '', true);
END;
$$;
