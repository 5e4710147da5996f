-- The outbox relay's progress: the last global position it published and saw acknowledged.
CREATE TABLE relay_positions (
    relay       text        PRIMARY KEY,
    position    bigint      NOT NULL CHECK (position >= 0),
    updated_at  timestamptz NOT NULL DEFAULT now()
);
