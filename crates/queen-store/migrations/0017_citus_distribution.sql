-- Spreading the schema over a Citus cluster (docs/scale-out.md). Only where the citus extension
-- is installed in this database; on plain PostgreSQL nothing changes but the record of that, in
-- queen.system_state under 'distribution'. A database that gets Citus later is spread by calling
-- queen.distribute_over_citus() once, at a quiet time (tables with rows are copied to their
-- shards while they are locked).
--
-- The model: every per-partition table is distributed by partition id and co-located with the
-- partition row, so one partition's segments, message ids, cursors, dead letters and traces live
-- on one shard and a push, pop or ack of one partition is routed to it. Small tables read by every
-- statement are reference tables, copied to every node. The few keyed by something else are
-- distributed by their own key.
CREATE FUNCTION queen.distribute_over_citus() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    -- A table spread by id cannot keep a uniqueness without it: queen.partition_names keeps it.
    ALTER TABLE queen.partitions DROP CONSTRAINT partitions_queue_id_name_key;
    -- Citus runs no trigger on a distributed table unless told to: the cascade does the work of
    -- migration 5's trigger, paying the key check per pushed message it saved, but on the shard.
    DROP TRIGGER partitions_delete_message_ids ON queen.partitions;
    DROP FUNCTION queen.delete_message_ids_of_partition();
    ALTER TABLE queen.log_message_ids
        ADD FOREIGN KEY (partition_id) REFERENCES queen.partitions (id) ON DELETE CASCADE;

    -- Read on every node, written rarely.
    PERFORM create_reference_table('queen.queues');
    PERFORM create_reference_table('queen.consumer_groups_metadata');
    PERFORM create_reference_table('queen.system_state');
    PERFORM create_reference_table('queen.brokers');
    PERFORM create_reference_table('queen.maintenance_runs');
    PERFORM create_reference_table('queen.traffic_samples');
    PERFORM create_reference_table('queen.lag_samples');

    -- One partition, one shard.
    PERFORM create_distributed_table('queen.partitions', 'id');
    PERFORM create_distributed_table('queen.log_segments', 'partition_id', colocate_with => 'queen.partitions');
    PERFORM create_distributed_table('queen.log_message_ids', 'partition_id', colocate_with => 'queen.partitions');
    PERFORM create_distributed_table('queen.log_consumers', 'partition_id', colocate_with => 'queen.partitions');
    PERFORM create_distributed_table('queen.log_dlq', 'partition_id', colocate_with => 'queen.partitions');
    PERFORM create_distributed_table('queen.message_traces', 'partition_id', colocate_with => 'queen.partitions');
    PERFORM create_distributed_table('queen.message_trace_names', 'partition_id', colocate_with => 'queen.partitions');

    -- Keyed by something else: a partition's name by its queue, KV by namespace, timers by queue.
    PERFORM create_distributed_table('queen.partition_names', 'queue_id', colocate_with => 'none');
    PERFORM create_distributed_table('queen.kv', 'ns', colocate_with => 'none');
    PERFORM create_distributed_table('queen.kv_version_floors', 'ns', colocate_with => 'queen.kv');
    PERFORM create_distributed_table('queen.timers', 'queue', colocate_with => 'none');

    UPDATE queen.system_state SET value = '{"engine": "citus"}', updated_at = now() WHERE key = 'distribution';
END
$$;

INSERT INTO queen.system_state (key, value) VALUES ('distribution', '{"engine": "postgres"}');

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') THEN
        PERFORM queen.distribute_over_citus();
    END IF;
END
$$;
