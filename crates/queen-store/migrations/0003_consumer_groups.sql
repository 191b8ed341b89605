-- Where a consumer group starts on a queue, recorded at the group's first pop of the queue.
-- Cursors created later (on partitions the group has not read yet, including partitions created
-- after the registration) are seeded from it, so a new partition's backlog is not hidden.
CREATE TABLE queen.consumer_groups_metadata (
    queue_name        text NOT NULL,
    consumer_group    text NOT NULL,
    -- 'all': from the oldest retained message; 'new': from the registration time;
    -- 'timestamp': from subscription_from.
    subscription_mode text NOT NULL CHECK (subscription_mode IN ('all', 'new', 'timestamp')),
    subscription_from timestamptz,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (queue_name, consumer_group),
    CHECK ((subscription_mode = 'all') = (subscription_from IS NULL))
);

CREATE INDEX consumer_groups_metadata_group ON queen.consumer_groups_metadata (consumer_group);
-- Group admin looks cursors up by group.
CREATE INDEX log_consumers_group ON queen.log_consumers (consumer_group);
