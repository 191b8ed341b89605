-- The segment log: queues, partitions, segments, the transaction-id index and group cursors.

CREATE TABLE queen.queues (
    id                          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name                        text NOT NULL UNIQUE,
    namespace                   text,
    task                        text,
    -- The options the broker acts on, typed; `options` keeps every option as configured so that
    -- configure can echo it back exactly, unknown keys included.
    lease_time_seconds          integer NOT NULL DEFAULT 300,
    retry_limit                 integer NOT NULL DEFAULT 3,
    delayed_processing_seconds  integer NOT NULL DEFAULT 0,
    window_buffer_seconds       integer NOT NULL DEFAULT 0,
    retention_enabled           boolean NOT NULL DEFAULT false,
    retention_seconds           integer NOT NULL DEFAULT 0,
    completed_retention_seconds integer NOT NULL DEFAULT 0,
    priority                    integer NOT NULL DEFAULT 0,
    options                     jsonb NOT NULL DEFAULT '{}',
    created_at                  timestamptz NOT NULL DEFAULT now(),
    updated_at                  timestamptz NOT NULL DEFAULT now()
);

-- One row per partition (lane). The row is the partition's append lock: a push locks it, takes
-- the next offsets from last_offset and commits, so offsets are dense and assigned in commit order.
CREATE TABLE queen.partitions (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue_id        bigint NOT NULL REFERENCES queen.queues (id) ON DELETE CASCADE,
    name            text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    last_offset     bigint NOT NULL DEFAULT 0,   -- 0 = nothing pushed yet
    retained_from   bigint NOT NULL DEFAULT 1,   -- lowest offset still stored (retention watermark)
    last_segment_at timestamptz,                 -- created_at of the newest segment; never decreases
    UNIQUE (queue_id, name)
) WITH (fillfactor = 80);  -- room for the HOT update of last_offset on every push

-- One row per committed push batch: the batch's frames, zstd-compressed.
CREATE TABLE queen.log_segments (
    partition_id bigint NOT NULL REFERENCES queen.partitions (id) ON DELETE CASCADE,
    base_offset  bigint NOT NULL,
    end_offset   bigint NOT NULL,
    created_at   timestamptz NOT NULL,
    frame_count  integer NOT NULL,
    raw_length   integer NOT NULL,
    body         bytea NOT NULL,
    PRIMARY KEY (partition_id, base_offset),
    CHECK (end_offset - base_offset + 1 = frame_count)
);
-- The body is already zstd: stop PostgreSQL from trying to compress it again.
ALTER TABLE queen.log_segments ALTER COLUMN body SET STORAGE EXTERNAL;
-- Timestamp walks (subscription start, seek): created_at never decreases along offsets, so the
-- first segment at or after a time is the first entry of this index at or after it.
CREATE INDEX log_segments_created_at ON queen.log_segments (partition_id, created_at, base_offset);

-- The transaction-id index: the one per-message row. It serves producer dedup and message
-- lookup by (partitionId, transactionId); it is written in bulk with its segment.
CREATE TABLE queen.log_message_ids (
    partition_id   bigint NOT NULL REFERENCES queen.partitions (id) ON DELETE CASCADE,
    transaction_id text NOT NULL,
    message_offset bigint NOT NULL,
    message_id     uuid NOT NULL,
    PRIMARY KEY (partition_id, transaction_id)
);

-- A consumer group's cursor on one partition, with its lease. The columns an ack changes carry no
-- index, so an ack stays a heap-only tuple update. A released lease keeps its lease_id and loses
-- its expiry, for the same reason.
CREATE TABLE queen.log_consumers (
    partition_id     bigint NOT NULL REFERENCES queen.partitions (id) ON DELETE CASCADE,
    consumer_group   text NOT NULL,
    committed        bigint NOT NULL,          -- last acknowledged offset
    lease_id         uuid,
    lease_expires_at timestamptz,              -- NULL = no live lease
    leased_until     bigint,                   -- last offset of the leased span
    lease_broker     text,                     -- the broker that granted the lease
    head_attempts    integer NOT NULL DEFAULT 0, -- deliveries of the message at committed + 1
    retry_count      integer NOT NULL DEFAULT 0, -- failed acks of that message
    redelivery_count integer NOT NULL DEFAULT 0, -- leases of this cursor that expired
    total_consumed   bigint NOT NULL DEFAULT 0,
    created_at       timestamptz NOT NULL DEFAULT now(),
    last_claimed_at  timestamptz,
    last_consumed_at timestamptz,
    PRIMARY KEY (partition_id, consumer_group),
    CHECK (committed >= 0)
) WITH (fillfactor = 70);

CREATE INDEX log_consumers_lease_id ON queen.log_consumers (lease_id) WHERE lease_id IS NOT NULL;
