-- Every pushed message writes a row here, and the foreign key to queen.partitions checked (and
-- share-locked) the partition row once per message: about a tenth of PostgreSQL's time on the
-- push path. Partitions are deleted rarely (queue deletion, partition clean-up), so their message
-- ids are removed by a trigger instead of by ON DELETE CASCADE. A push inserts ids only joined to
-- the partition row it has just updated, so ids of a deleted partition cannot appear afterwards.
ALTER TABLE queen.log_message_ids DROP CONSTRAINT log_message_ids_partition_id_fkey;

CREATE FUNCTION queen.delete_message_ids_of_partition() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM queen.log_message_ids WHERE partition_id = OLD.id;
    RETURN OLD;
END
$$;

CREATE TRIGGER partitions_delete_message_ids AFTER DELETE ON queen.partitions
    FOR EACH ROW EXECUTE FUNCTION queen.delete_message_ids_of_partition();
