-- Dead letters: snapshot copies of messages a consumer group gave up on. They are not tied to
-- the segments they came from, so retention and partition clean-up never remove them.
CREATE TABLE queen.log_dlq (
    id                 bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue_name         text NOT NULL,
    partition_id       bigint NOT NULL,
    partition_name     text NOT NULL,
    consumer_group     text NOT NULL,
    message_offset     bigint NOT NULL,
    message_id         uuid NOT NULL,
    transaction_id     text NOT NULL,
    trace_id           uuid,
    payload            bytea NOT NULL,   -- the message's data as JSON text, byte for byte
    error_message      text,
    retry_count        integer NOT NULL,
    message_created_at timestamptz NOT NULL,
    failed_at          timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX log_dlq_queue ON queen.log_dlq (queue_name, failed_at);
CREATE INDEX log_dlq_message ON queen.log_dlq (partition_id, transaction_id);
