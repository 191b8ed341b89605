-- Trace events that consumers attach to messages (`POST /api/v1/traces`), one row per event.
-- An event is keyed by its message's place in the log, (partition_id, message_offset): reads by
-- message and retention below a partition's watermark are range scans of one index, and the
-- events of a deleted partition (queue deletion, partition clean-up) go by cascade. Unlike
-- queen.log_message_ids (migration 5), this table keeps its foreign key: an event is written by a
-- consumer's explicit call, never per pushed message, and its check takes a KEY SHARE lock on the
-- partition row, which does not conflict with the row update every push makes.
-- Nothing on the push, pop or ack path reads or writes these tables.
CREATE TABLE queen.message_traces (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    partition_id   bigint NOT NULL REFERENCES queen.partitions (id) ON DELETE CASCADE,
    message_offset bigint NOT NULL,
    transaction_id text NOT NULL,
    message_id     uuid NOT NULL,
    consumer_group text NOT NULL,
    event_type     text NOT NULL,
    -- The event's names as given, for reading it back; searched through message_trace_names.
    trace_names    text[] NOT NULL DEFAULT '{}',
    -- The consumer's object as sent (json, not jsonb: kept as text, nothing queries inside it).
    data           json NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX message_traces_message ON queen.message_traces (partition_id, message_offset, id);

-- The name index: one row per (name, event). Reading a name's events newest first is a backward
-- scan of the primary key; listing names walks it one distinct name at a time.
CREATE TABLE queen.message_trace_names (
    name     text NOT NULL,
    trace_id bigint NOT NULL REFERENCES queen.message_traces (id) ON DELETE CASCADE,
    PRIMARY KEY (name, trace_id)
);
-- What the cascade from an event to its names looks up.
CREATE INDEX message_trace_names_trace ON queen.message_trace_names (trace_id);
