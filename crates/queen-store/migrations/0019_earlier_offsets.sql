-- A transaction id pushed again after its queue's dedup window is stored as a new message, and
-- its index row moves to that message. The offsets it held before stay here, so an ack that
-- names the id is resolved to the message the group has not consumed yet (the earliest past its
-- cursor), as the broker that delivered it would resolve it, and not to the later copy, whose ack
-- would commit the messages between the two, unprocessed. NULL for an id stored once.
ALTER TABLE queen.log_message_ids ADD COLUMN earlier_offsets bigint[];
