-- Key/value state (`POST /api/v1/kv`, the transaction `kv` rider) and the lock permits built on
-- it (`POST /api/v1/locks`, namespace `queen-locks`).
--
-- One row per (namespace, key). `version` counts the writes of the key and is what
-- compare-and-set and lock tokens are made of, so it must never run backwards:
--   * a live row has a non-NULL `value` and `expires_at` NULL (forever) or in the future;
--   * a row whose `value` is NULL is dead: a deleted key (its tombstone) or a placeholder a writer
--     inserted to have something to lock. It keeps the key's last version, so the next write
--     continues from it, and `expires_at` is when it died, so maintenance removes it;
--   * a row past `expires_at` is dead too, whatever its value: every read filters on the expiry
--     and every write treats such a row as absent.
-- Maintenance deletes dead rows in batches and raises the namespace's floor in
-- `kv_version_floors` to the highest version it deleted, in the same statement; a key written
-- anew starts above both its own row's version and that floor, so no key ever shows a version it
-- had before.
--
-- Keys compare byte-wise (COLLATE "C"): the primary key's order is then the order of keyset pages
-- and of row locks, whatever the database's collation.
CREATE TABLE queen.kv (
    ns         text COLLATE "C" NOT NULL,
    key        text COLLATE "C" NOT NULL,
    value      jsonb,
    version    bigint NOT NULL,
    expires_at timestamptz,
    -- When the key's current life began (its last creation from absent).
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    PRIMARY KEY (ns, key)
);

-- Maintenance's scan for dead rows, oldest first.
CREATE INDEX kv_expiry ON queen.kv (expires_at) WHERE expires_at IS NOT NULL;

-- Per namespace, the highest version maintenance has deleted.
CREATE TABLE queen.kv_version_floors (
    ns      text COLLATE "C" PRIMARY KEY,
    version bigint NOT NULL
);
