-- What the dashboard shows of the fleet and its recent past.
--
-- `brokers`: one row per broker process, written by the broker itself at every heartbeat
-- (`stats.sample_interval_seconds`). A broker that stops gracefully says so; one that is not seen
-- for a few heartbeats is reported missing. Rows not seen for a day are pruned by maintenance.
CREATE TABLE queen.brokers (
    id                text PRIMARY KEY,
    version           text NOT NULL,
    started_at        timestamptz NOT NULL,
    seen_at           timestamptz NOT NULL,
    stopping          boolean NOT NULL DEFAULT false,
    stopped_at        timestamptz,
    buffered_messages bigint NOT NULL DEFAULT 0,
    buffer_healthy    boolean NOT NULL DEFAULT true
);

-- Each broker's traffic per heartbeat: what its counters grew by since its last sample (only
-- heartbeats with traffic write a row). The fleet's throughput is their sum per interval.
CREATE TABLE queen.traffic_samples (
    sampled_at    timestamptz NOT NULL,
    broker_id     text NOT NULL,
    pushed        bigint NOT NULL,
    delivered     bigint NOT NULL,
    acked         bigint NOT NULL,
    failed        bigint NOT NULL,
    dead_lettered bigint NOT NULL,
    PRIMARY KEY (sampled_at, broker_id)
);

-- The consumer lag of the whole fleet, sampled once per interval by whichever broker takes the
-- sampler's turn: messages behind every cursor, and the age of the oldest unread one.
CREATE TABLE queen.lag_samples (
    sampled_at   timestamptz PRIMARY KEY,
    lag_messages bigint NOT NULL,
    lag_seconds  double precision NOT NULL
);
