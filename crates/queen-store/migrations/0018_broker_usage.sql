-- What each broker used in each heartbeat interval, beside its traffic: the resource series of
-- /api/v1/analytics/system-metrics and /worker-metrics. From this migration on a broker writes a
-- row at every heartbeat, with traffic or without. Rows written before it, or by a broker of an
-- earlier version during a rolling upgrade, have these columns NULL.
ALTER TABLE queen.traffic_samples
    -- Seconds since the broker's previous recorded sample: what cpu_seconds was spent over.
    ADD COLUMN interval_seconds    double precision,
    ADD COLUMN cpu_seconds         double precision,
    -- The process's resident memory, and its database pool, when the sample was taken.
    ADD COLUMN resident_bytes      bigint,
    ADD COLUMN db_connections      integer,
    ADD COLUMN db_idle_connections integer,
    ADD COLUMN db_max_connections  integer,
    -- Requests waiting for a pooled connection, and long polls parked for messages.
    ADD COLUMN db_waiting          integer,
    ADD COLUMN long_poll_waiters   integer,
    -- Statements that failed in the interval (of any kind).
    ADD COLUMN db_errors           bigint;
