-- A conflating group is served only the newest visible message of a partition, and its ack
-- retires everything behind it. The choice is made once, at the group's registration on a queue.
ALTER TABLE queen.consumer_groups_metadata ADD COLUMN conflation boolean NOT NULL DEFAULT false;
