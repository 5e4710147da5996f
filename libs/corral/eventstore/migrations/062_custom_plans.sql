-- Plan every statement of the append path for the log as it is now, not as it was.
--
-- The problem (bench/e2e.py, 2026-12-04): a service's connection is opened when the log holds a
-- few events. PL/pgSQL caches each statement's plan per connection, and after five calls it
-- settles on a generic plan costed for the table as it was then: a sequential scan of `events`
-- was cheapest for a few rows, and stayed the plan as the log grew (until an autovacuum ANALYZE
-- happened to invalidate it). Every append then scanned the whole log while holding the head
-- lock that orders all appends: ~1 scan per job and ~4,000 rows read per job at 10,000 events,
-- and an append 3x slower; at a million events it would be a second per append.
--
-- The fix: these functions plan each statement for its actual arguments and the table's current
-- size (a custom plan: tens of microseconds of planning against an index lookup, never a scan).
ALTER FUNCTION corral_append(text[], integer[], integer[], text[], text[], integer[], text[], text[],
                             text[], timestamptz[], text, text)
    SET plan_cache_mode = force_custom_plan;
ALTER FUNCTION corral_append_tracked(text[], integer[], integer[], text[], text[], integer[], text[],
                                     text[], text[], timestamptz[], text, text[])
    SET plan_cache_mode = force_custom_plan;
ALTER FUNCTION events_chain_hash() SET plan_cache_mode = force_custom_plan;
ALTER FUNCTION allocations_follow_ledger() SET plan_cache_mode = force_custom_plan;
