-- Broker-wide switches an operator sets through the API, shared by every broker of a fleet:
-- `push_maintenance` (pushes are accepted into each broker's local journal instead of the log)
-- and `pop_maintenance` (pops answer empty, marked paused). Each value is
-- {"enabled": bool, "revision": n}; every change takes the next revision, so a broker can tell a
-- late notice from a newer state.
CREATE TABLE queen.system_state (
    key        text PRIMARY KEY,
    value      jsonb NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);

INSERT INTO queen.system_state (key, value) VALUES
    ('push_maintenance', '{"enabled": false, "revision": 0}'),
    ('pop_maintenance', '{"enabled": false, "revision": 0}');
