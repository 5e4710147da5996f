-- Plan the append path once per connection, and never as a scan of the log.
--
-- The problem: 062 made every statement of the append path (the append functions and the triggers
-- each inserted event fires: the hash chain, the allocations mirror) be planned again on every
-- call, so that no connection could keep a plan costed for the log when it was small (a
-- sequential scan of `events` under the head lock). Planning on every call, and per inserted row
-- in the triggers, cost Postgres more than the appending itself: 0.81-0.89 ms of Postgres CPU for
-- a one-event append, 1.4-1.6 ms for a ten-event one (`bench/eventstore.py`, 2026-12-06). At 25
-- jobs/s a job is ~7 appends (`bench/e2e.py`), and Postgres was the largest consumer of CPU.
--
-- The fix: the plans are made once and kept (`force_generic_plan`), and a plan may not scan a
-- table an index serves (`enable_seqscan = off`, inside these functions only): a plan made while
-- the log held three events is the same index lookup as one made at a million. Postgres CPU per
-- append: 0.39-0.42 ms (one event), 0.90-0.93 ms (ten). `tests/integration/test_eventstore.py`
-- (`..._does_not_scan_the_log`) fails with generic plans alone.
ALTER FUNCTION corral_append(text[], integer[], integer[], text[], text[], integer[], text[], text[],
                             text[], timestamptz[], text, text)
    SET plan_cache_mode = force_generic_plan SET enable_seqscan = off;
ALTER FUNCTION corral_append_tracked(text[], integer[], integer[], text[], text[], integer[], text[],
                                     text[], text[], timestamptz[], text, text[])
    SET plan_cache_mode = force_generic_plan SET enable_seqscan = off;
ALTER FUNCTION events_chain_hash() SET plan_cache_mode = force_generic_plan SET enable_seqscan = off;
ALTER FUNCTION allocations_follow_ledger() SET plan_cache_mode = force_generic_plan SET enable_seqscan = off;
