-- The append-only event log.
--
-- (stream, version) is the primary key: two appenders racing for the same next version cannot both
-- win. `position` is the global order, assigned from `event_log_head` under its row lock, so it is
-- gapless and follows commit order (see corral/eventstore/store.py for why that matters).
-- `data` is `json` (not `jsonb`): the text is validated as JSON and kept byte for byte.

CREATE TABLE events (
    stream          text        NOT NULL,
    version         integer     NOT NULL CHECK (version >= 1),
    position        bigint      NOT NULL CHECK (position >= 1),
    event_id        text        NOT NULL,
    type            text        NOT NULL,
    schema_version  integer     NOT NULL CHECK (schema_version >= 1),
    data            json        NOT NULL,
    correlation_id  text,
    causation_id    text,
    occurred_at     timestamptz NOT NULL,
    recorded_at     timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT events_pkey PRIMARY KEY (stream, version),
    CONSTRAINT events_position_key UNIQUE (position),
    CONSTRAINT events_event_id_key UNIQUE (event_id)
);

CREATE INDEX events_correlation_id ON events (correlation_id) WHERE correlation_id IS NOT NULL;

-- One row: the last global position handed out. Appenders lock it (SELECT ... FOR UPDATE) and
-- advance it in their transaction, which serialises appends and makes positions commit-ordered.
CREATE TABLE event_log_head (
    id        boolean PRIMARY KEY DEFAULT true CHECK (id),
    position  bigint  NOT NULL
);
INSERT INTO event_log_head (id, position) VALUES (true, 0);

-- The log is the truth, so the database itself refuses to rewrite history.
CREATE FUNCTION events_are_immutable() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the events table is append-only: % is refused', TG_OP
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'append a compensating event instead of changing history';
END;
$$;

CREATE TRIGGER events_no_update_or_delete
    BEFORE UPDATE OR DELETE ON events
    FOR EACH ROW EXECUTE FUNCTION events_are_immutable();

CREATE TRIGGER events_no_truncate
    BEFORE TRUNCATE ON events
    FOR EACH STATEMENT EXECUTE FUNCTION events_are_immutable();
