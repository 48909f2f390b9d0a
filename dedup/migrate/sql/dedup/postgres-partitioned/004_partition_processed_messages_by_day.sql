-- idemq: the processed-message table partitioned by day (UTC) of
-- processed_at, for dedup/pgdedup with Config.Partitioned. Applied only when
-- asked for (migrate.Config.Partitioned, `idemq migrate --partitioned`); an
-- unpartitioned table keeps working as before without it.
--
-- No record is copied: the table becomes the first partition of a
-- partitioned table that takes its name, covering every time before the
-- cut (the start of the day after tomorrow, UTC); the partitions of later
-- days are created empty. Claims write into it until the cut, and
-- pgdedup's janitor drops it a retention after the cut, as it drops the
-- partition of a day a retention after that day (partitions are named
-- <table>_pYYYYMMDD by their last day).
--
-- Attaching the table needs a unique index that includes the partition key
-- and a proof that every row is before the cut. Made here, they block the
-- table's writes while the index is built and the table is read; `idemq
-- migrate --partitioned` makes both beforehand without blocking writes
-- (migrate.Migrator.PartitionPrelude: CREATE UNIQUE INDEX CONCURRENTLY and a
-- CHECK constraint validated apart), so that what remains here is a few
-- catalog changes. docs/operations.md has the measured times.
--
-- The primary key includes processed_at (PostgreSQL enforces uniqueness
-- only within a partition), so pgdedup does not rely on it: a claim takes a
-- transaction-scoped advisory lock per key and inserts only when no
-- partition holds the key.

-- +goose Up
DO $$
DECLARE
    t      regclass := 'processed_messages'::regclass;
    nsp    text;
    name   text;
    cut    timestamptz := ((now() AT TIME ZONE 'UTC')::date + 2)::timestamp AT TIME ZONE 'UTC';
    day    date;
BEGIN
    IF (SELECT relkind FROM pg_class WHERE oid = t) = 'p' THEN
        RETURN;
    END IF;
    SELECT n.nspname, c.relname INTO nsp, name
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = t;
    EXECUTE format('CREATE UNIQUE INDEX IF NOT EXISTS %I ON %s (scope, key, processed_at)', name || '_partition_idx', t);
    IF NOT EXISTS (SELECT FROM pg_constraint WHERE conrelid = t AND conname = name || '_partition_bound' AND convalidated) THEN
        EXECUTE format('ALTER TABLE %s DROP CONSTRAINT IF EXISTS %I', t, name || '_partition_bound');
        EXECUTE format('ALTER TABLE %s ADD CONSTRAINT %I CHECK (processed_at < %L)', t, name || '_partition_bound', cut);
    END IF;

    EXECUTE format('ALTER TABLE %s RENAME TO %I', t, name || '_p' || to_char((cut AT TIME ZONE 'UTC')::date - 1, 'YYYYMMDD'));
    -- A partition has the parent's primary key or none: the unique index
    -- on (scope, key, processed_at) becomes its key, without a build.
    EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', t, name || '_pkey');
    EXECUTE format('ALTER TABLE %s ADD CONSTRAINT %I PRIMARY KEY USING INDEX %I', t, name || '_legacy_pkey', name || '_partition_idx');
    CREATE TABLE processed_messages (
        scope        text        NOT NULL,
        key          text        NOT NULL,
        payload_hash bytea       NOT NULL,
        processed_at timestamptz NOT NULL DEFAULT now(),
        expires_at   timestamptz NOT NULL,
        result       bytea,
        PRIMARY KEY (scope, key, processed_at)
    ) PARTITION BY RANGE (processed_at);
    EXECUTE format('ALTER TABLE %s ATTACH PARTITION %s FOR VALUES FROM (MINVALUE) TO (%L)', 'processed_messages'::regclass, t, cut);
    EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', t, name || '_partition_bound');

    day := (cut AT TIME ZONE 'UTC')::date;
    EXECUTE format('CREATE TABLE %I.%I PARTITION OF %s FOR VALUES FROM (%L) TO (%L)',
        nsp, name || '_p' || to_char(day, 'YYYYMMDD'), 'processed_messages'::regclass,
        day::timestamp AT TIME ZONE 'UTC', (day + 1)::timestamp AT TIME ZONE 'UTC');
END
$$;

-- +goose Down
DO $$
DECLARE
    t      regclass := 'processed_messages'::regclass;
    nsp    text;
    name   text;
    legacy regclass;
BEGIN
    IF (SELECT relkind FROM pg_class WHERE oid = t) <> 'p' THEN
        RETURN;
    END IF;
    SELECT n.nspname, c.relname INTO nsp, name
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = t;
    EXECUTE format('LOCK TABLE %s IN ACCESS EXCLUSIVE MODE', t);
    SELECT i.inhrelid INTO legacy FROM pg_inherits AS i JOIN pg_class AS c ON c.oid = i.inhrelid
        WHERE i.inhparent = t AND pg_get_expr(c.relpartbound, c.oid) LIKE 'FOR VALUES FROM (MINVALUE)%';
    IF legacy IS NULL THEN
        EXECUTE format('CREATE TABLE %I.%I (LIKE %s INCLUDING DEFAULTS)', nsp, name || '_legacy', t);
        legacy := format('%I.%I', nsp, name || '_legacy')::regclass;
        EXECUTE format('CREATE INDEX IF NOT EXISTS %I ON %s USING brin (expires_at)', name || '_expires_at_idx', legacy);
    ELSE
        EXECUTE format('ALTER TABLE %s DETACH PARTITION %s', t, legacy);
        EXECUTE format('ALTER TABLE %s DROP CONSTRAINT IF EXISTS %I', legacy,
            (SELECT conname FROM pg_constraint WHERE conrelid = legacy AND contype = 'p'));
    END IF;
    EXECUTE format('ALTER TABLE %s ADD CONSTRAINT %I PRIMARY KEY (scope, key)', legacy, name || '_legacy_pkey');
    EXECUTE format('INSERT INTO %s (scope, key, payload_hash, processed_at, expires_at, result)
        SELECT scope, key, payload_hash, processed_at, expires_at, result FROM %s
        ON CONFLICT (scope, key) DO UPDATE SET payload_hash = excluded.payload_hash,
            processed_at = excluded.processed_at, expires_at = excluded.expires_at, result = excluded.result', legacy, t);
    EXECUTE format('DROP TABLE %s', t);
    EXECUTE format('ALTER TABLE %s RENAME TO %I', legacy, name);
    EXECUTE format('ALTER TABLE %s RENAME CONSTRAINT %I TO %I', legacy, name || '_legacy_pkey', name || '_pkey');
END
$$;
