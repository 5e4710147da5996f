-- The hash chain's trigger (051) builds each row's canonical text in its own body.
--
-- Why: an SQL function called from PL/pgSQL with the row (`events_canonical(NEW)`) is not inlined,
-- and is parsed and planned again at every call: about as much Postgres CPU per appended event as
-- the rest of the chain and the allocations mirror together. The expression is
-- `events_canonical`'s, field for field; that function stays the definition, with
-- corral.eventstore.chain.canonical, which checks every hash the trigger writes.
CREATE OR REPLACE FUNCTION events_chain_hash() RETURNS trigger LANGUAGE plpgsql
    SET plan_cache_mode = force_generic_plan SET enable_seqscan = off AS $$
DECLARE
    previous bytea;
BEGIN
    SELECT hash INTO previous FROM events WHERE position = NEW.position - 1;
    NEW.hash := sha256(coalesce(previous, ''::bytea) || convert_to(
        NEW.position::text || E'\n' || NEW.stream || E'\n' || NEW.version::text || E'\n' || NEW.event_id
        || E'\n' || NEW.type || E'\n' || NEW.schema_version::text || E'\n' || coalesce(NEW.correlation_id, '')
        || E'\n' || coalesce(NEW.causation_id, '') || E'\n'
        || ((extract(epoch FROM NEW.occurred_at) * 1000000)::bigint)::text || E'\n' || NEW.data::text, 'UTF8'));
    RETURN NEW;
END
$$;
