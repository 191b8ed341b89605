-- Timers: messages scheduled for later. A timer is a push that waits here until it is due; the
-- sweeper of any broker claims it, appends it to its queue (transactionId = txn) and deletes it
-- in one transaction, so it is delivered once whichever broker fires it.
CREATE TABLE queen.timers (
    queue       text NOT NULL,          -- the destination, by name: a timer may create its queue
    timer_key   text NOT NULL,
    partition   text NOT NULL,
    txn         text NOT NULL,          -- the delivered message's transactionId (dedup key)
    message_id  uuid NOT NULL,          -- the delivered message's id, promised at scheduling
    payload     bytea NOT NULL,         -- JSON text; sealed when its queue was encrypted then
    producer    text,                   -- producerSub: the subject of the token that scheduled it
    deliver_at  timestamptz NOT NULL,   -- not delivered before this
    -- When a sweeper may take it next: deliver_at, then the end of a claim or of a backoff.
    -- NULL once its delivery attempts are spent: held until it is rescheduled or cancelled.
    fire_at     timestamptz,
    claim_token uuid,                   -- set by the broker delivering it, valid until fire_at
    attempts    integer NOT NULL DEFAULT 0,  -- failed deliveries since it was last scheduled
    last_error  text,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (queue, timer_key)
);

-- The sweep and its cheap "next due" probe: the first entry of this index.
CREATE INDEX timers_fire_at ON queen.timers (fire_at) WHERE fire_at IS NOT NULL;
