-- Every queue option of the client contract acts, so each gets a typed column; `options` becomes
-- `unknown_options`: the options this broker does not know, kept and echoed as configured.
ALTER TABLE queen.queues
    ADD COLUMN retry_delay_ms        integer NOT NULL DEFAULT 0,     -- a failed message waits this long
    ADD COLUMN max_size              bigint  NOT NULL DEFAULT 0,     -- most unconsumed messages; 0 = no limit
    ADD COLUMN ttl_seconds           integer NOT NULL DEFAULT 0,     -- older messages are never delivered
    ADD COLUMN max_wait_seconds      integer NOT NULL DEFAULT 0,     -- the same, upstream's other name
    ADD COLUMN dead_letter_queue     boolean NOT NULL DEFAULT true,  -- automatic dead-lettering at all
    ADD COLUMN dlq_after_max_retries boolean NOT NULL DEFAULT true,  -- dead-letter retry exhaustion
    ADD COLUMN encryption_enabled    boolean NOT NULL DEFAULT false, -- segment bodies sealed at rest
    ADD COLUMN dedup_window_seconds  integer NOT NULL DEFAULT 0;     -- 0 = while the message is retained

ALTER TABLE queen.queues RENAME COLUMN options TO unknown_options;
UPDATE queen.queues SET unknown_options = unknown_options - ARRAY[
    'leaseTime', 'retryLimit', 'retryDelay', 'priority', 'delayedProcessing', 'windowBuffer', 'maxSize', 'ttl',
    'maxWaitTimeSeconds', 'deadLetterQueue', 'dlqAfterMaxRetries', 'retentionEnabled', 'retentionSeconds',
    'completedRetentionSeconds', 'encryptionEnabled', 'dedupWindowSeconds'];

-- A failed message's partition is not served to the group before this time (retryDelay).
ALTER TABLE queen.log_consumers ADD COLUMN retry_at timestamptz;
