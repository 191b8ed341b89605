-- One row per maintenance pass (retention and partition clean-up) that a broker ran: which
-- broker, when, and what it removed. Passes are serialised across the fleet by an advisory lock;
-- this log shows it, and what each pass did. Rows older than a week are pruned by the passes.
CREATE TABLE queen.maintenance_runs (
    id                 bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    broker             text NOT NULL,
    started_at         timestamptz NOT NULL,
    finished_at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    segments_deleted   bigint NOT NULL,
    messages_deleted   bigint NOT NULL,
    partitions_deleted bigint NOT NULL
);

CREATE INDEX maintenance_runs_started_at ON queen.maintenance_runs (started_at);
