-- Exactly-once effects for consumers.
--
-- A consumer appends its effects with a tracking row in the same transaction; the primary key makes
-- a redelivered message's second attempt a no-op. Checkpoints let a consumer that reads the log
-- (rather than the bus) resume where it stopped.

CREATE TABLE consumer_tracking (
    consumer      text        NOT NULL,
    key           text        NOT NULL,
    processed_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, key)
);

CREATE TABLE consumer_checkpoints (
    consumer    text        PRIMARY KEY,
    position    bigint      NOT NULL CHECK (position >= 0),
    updated_at  timestamptz NOT NULL DEFAULT now()
);
