-- Every per-partition table keyed by partition_id, so that a distributed PostgreSQL (Citus,
-- migration 17) can spread them over shards by partition_id, co-located, and route each
-- statement of one partition to one shard. Its rule: a distributed table's primary key and unique
-- constraints include the distribution column, and so do foreign keys between two of them.

-- Partition names: which partition a (queue, name) is. The partition row cannot hold this
-- uniqueness once partitions are spread by id, so the directory holds it, keyed by queue: one
-- shard answers a lookup and takes a creation. Partitions are created through it (their id taken
-- from the partitions' own sequence) and removed from it with their partition row.
CREATE TABLE queen.partition_names (
    queue_id     bigint NOT NULL REFERENCES queen.queues (id) ON DELETE CASCADE,
    name         text NOT NULL,
    partition_id bigint NOT NULL,
    PRIMARY KEY (queue_id, name)
);
INSERT INTO queen.partition_names (queue_id, name, partition_id) SELECT queue_id, name, id FROM queen.partitions;

-- Dead letters and trace events: keyed by their partition first.
ALTER TABLE queen.log_dlq DROP CONSTRAINT log_dlq_pkey, ADD PRIMARY KEY (partition_id, id);

ALTER TABLE queen.message_trace_names ADD COLUMN partition_id bigint;
UPDATE queen.message_trace_names n SET partition_id = t.partition_id FROM queen.message_traces t WHERE t.id = n.trace_id;
ALTER TABLE queen.message_trace_names
    ALTER COLUMN partition_id SET NOT NULL,
    DROP CONSTRAINT message_trace_names_trace_id_fkey,
    DROP CONSTRAINT message_trace_names_pkey;
ALTER TABLE queen.message_traces DROP CONSTRAINT message_traces_pkey, ADD PRIMARY KEY (partition_id, id);
-- (name, trace_id) first still: a name's events newest first is a backward walk of the key.
ALTER TABLE queen.message_trace_names
    ADD PRIMARY KEY (name, trace_id, partition_id),
    ADD FOREIGN KEY (partition_id, trace_id) REFERENCES queen.message_traces (partition_id, id) ON DELETE CASCADE;
DROP INDEX queen.message_trace_names_trace;
CREATE INDEX message_trace_names_trace ON queen.message_trace_names (partition_id, trace_id);
