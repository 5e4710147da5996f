-- No work per appended event for what nothing reads.
--
-- - The allocations mirror (004, 007) acts on GpusAllocated and GpusReleased only: a WHEN clause
--   on the event's type decides at insert time, so the other events of a job (about 11 of its 13)
--   neither queue the AFTER trigger nor enter its PL/pgSQL. The function and its rows are the same.
-- - No statement reads the log by correlation id, and every event has one: its index costs a
--   btree insert per event and serves nothing.
DROP TRIGGER events_maintain_allocations ON events;
CREATE TRIGGER events_maintain_allocations
    AFTER INSERT ON events
    FOR EACH ROW WHEN (NEW.type IN ('GpusAllocated', 'GpusReleased'))
    EXECUTE FUNCTION allocations_follow_ledger();

DROP INDEX events_correlation_id;
