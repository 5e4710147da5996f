-- A GpusReleased closes the allocation rows of ITS attempt and GPUs only.
--
-- Why: with the GPU fence (corral.lifecycle) a released attempt keeps its GPUs until the node
-- confirms its ranks are gone, so a node may hold the fenced GPUs of attempt N while attempt N+1
-- of the same job was placed on other GPUs of that node. 004 closed every open row of the job on
-- the node, which would have closed attempt N+1's rows too (and let the unique index accept a
-- second holder of those GPUs).

CREATE OR REPLACE FUNCTION allocations_follow_ledger() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.type = 'GpusAllocated' THEN
        INSERT INTO allocations (node, gpu, job_id, attempt, allocated_by, allocated_position)
        SELECT NEW.data->>'node', g::integer, NEW.data->>'job_id',
               COALESCE((NEW.data->>'attempt')::integer, 0), NEW.event_id, NEW.position
        FROM json_array_elements_text(NEW.data->'gpus') AS g;
    ELSIF NEW.type = 'GpusReleased' THEN
        UPDATE allocations SET released_by = NEW.event_id, released_position = NEW.position
        WHERE node = NEW.data->>'node' AND job_id = NEW.data->>'job_id' AND released_by IS NULL
          AND attempt = COALESCE((NEW.data->>'attempt')::integer, 0)
          AND gpu IN (SELECT g::integer FROM json_array_elements_text(NEW.data->'gpus') AS g);
    END IF;
    RETURN NEW;
END;
$$;
