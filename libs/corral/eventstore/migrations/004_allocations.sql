-- GPU allocations, mirrored from the node allocation ledger (GpusAllocated / GpusReleased events on
-- node-<name> streams) by a trigger, in the same transaction as the append.
--
-- Why: "one writer per resource" is enforced by the placement lease and by expected versions;
-- this is the last line of defence. Even if the code were wrong, the unique index makes a second
-- open allocation of one GPU impossible: the whole append (GangReserved included) rolls back.

CREATE TABLE allocations (
    node                text    NOT NULL,
    gpu                 integer NOT NULL,
    job_id              text    NOT NULL,
    attempt             integer NOT NULL,
    allocated_by        text    NOT NULL,
    allocated_position  bigint  NOT NULL,
    released_by         text,
    released_position   bigint
);

CREATE UNIQUE INDEX allocations_one_open_holder_per_gpu ON allocations (node, gpu) WHERE released_by IS NULL;
CREATE INDEX allocations_by_job ON allocations (job_id);

CREATE FUNCTION allocations_follow_ledger() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.type = 'GpusAllocated' THEN
        INSERT INTO allocations (node, gpu, job_id, attempt, allocated_by, allocated_position)
        SELECT NEW.data->>'node', g::integer, NEW.data->>'job_id',
               COALESCE((NEW.data->>'attempt')::integer, 0), NEW.event_id, NEW.position
        FROM json_array_elements_text(NEW.data->'gpus') AS g;
    ELSIF NEW.type = 'GpusReleased' THEN
        UPDATE allocations SET released_by = NEW.event_id, released_position = NEW.position
        WHERE node = NEW.data->>'node' AND job_id = NEW.data->>'job_id' AND released_by IS NULL;
    END IF;
    RETURN NEW;
END;
$$;

CREATE TRIGGER events_maintain_allocations
    AFTER INSERT ON events
    FOR EACH ROW EXECUTE FUNCTION allocations_follow_ledger();
