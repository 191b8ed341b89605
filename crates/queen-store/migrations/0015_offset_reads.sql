-- Partition discovery (`POST /api/v1/partitions/changed`) pages through a queue's partitions in
-- creation (id) order: a range scan of this index from the page's cursor. Neither column ever
-- changes, so the index costs pushes nothing (the update of `last_offset` stays heap-only).
CREATE INDEX partitions_queue_id_id ON queen.partitions (queue_id, id);
