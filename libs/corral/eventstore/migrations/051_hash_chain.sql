-- A tamper-evident log (issue 12): each event row carries `hash` = sha256(previous row's hash ||
-- canonical text of this row), computed as the row is appended (a BEFORE INSERT trigger: the append
-- functions hold `event_log_head`'s lock, so the previous position is always there and final).
-- A superuser who edits or deletes a row breaks the chain from that position on: see
-- corral.eventstore.chain (`verify_chain`) which recomputes it and names the first bad position.
-- The canonical text (one field per line) is defined once, in `events_canonical` here and in
-- corral.eventstore.chain.canonical, which must agree byte for byte.

ALTER TABLE events ADD COLUMN hash bytea;

CREATE FUNCTION events_canonical(e events) RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT e.position::text || E'\n' || e.stream || E'\n' || e.version::text || E'\n' || e.event_id
        || E'\n' || e.type || E'\n' || e.schema_version::text || E'\n' || coalesce(e.correlation_id, '')
        || E'\n' || coalesce(e.causation_id, '') || E'\n'
        || ((extract(epoch FROM e.occurred_at) * 1000000)::bigint)::text || E'\n' || e.data::text
$$;

CREATE FUNCTION events_chain_hash() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    previous bytea;
BEGIN
    SELECT hash INTO previous FROM events WHERE position = NEW.position - 1;
    NEW.hash := sha256(coalesce(previous, ''::bytea) || convert_to(events_canonical(NEW), 'UTF8'));
    RETURN NEW;
END
$$;

CREATE TRIGGER events_chain BEFORE INSERT ON events FOR EACH ROW EXECUTE FUNCTION events_chain_hash();
