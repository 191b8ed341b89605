-- Delivery guarantees. An ack may commit only offsets the group was delivered, so the cursor
-- remembers the highest one; a lease that runs out over the head message counts as a failed
-- delivery of it, and the dead letter says how many of its failures were expiries.
ALTER TABLE queen.log_consumers
    ADD COLUMN delivered_until bigint  NOT NULL DEFAULT 0,  -- highest offset ever delivered to the group
    ADD COLUMN head_expiries   integer NOT NULL DEFAULT 0;  -- leases over the head message that ran out
UPDATE queen.log_consumers SET delivered_until = GREATEST(committed, COALESCE(leased_until, 0));
-- Which broker granted a lease mattered only to a shutdown that released its leases; a shutdown
-- now leaves them to the fleet.
ALTER TABLE queen.log_consumers DROP COLUMN lease_broker;

-- A message can be given up on after retention removed its segment (the ack raced the trim): its
-- dead letter is kept without what is gone, and says so, rather than not kept at all.
ALTER TABLE queen.log_dlq
    ALTER COLUMN message_id DROP NOT NULL,
    ALTER COLUMN transaction_id DROP NOT NULL,
    ALTER COLUMN payload DROP NOT NULL,
    ALTER COLUMN message_created_at DROP NOT NULL;
