-- idemq: the processed-message table partitioned by day (UTC) of
-- processed_at, for dedup/pgdedup with Config.Partitioned. Applied only when
-- asked for (migrate.Config.Partitioned, `idemq migrate --partitioned`); an
-- unpartitioned table keeps working as before without it.
--
-- The table is renamed to processed_messages_unpartitioned (kept, for the
-- Down section and for review; drop it when satisfied), a partitioned table
-- takes its name, one partition per day is created from the oldest
-- unexpired record up to two days ahead, and the unexpired records are
-- copied. The old table is locked against writes (claims wait) for the
-- copy: docs/operations.md has the measured time per million records.
--
-- The primary key includes processed_at (PostgreSQL enforces uniqueness
-- only within a partition), so pgdedup does not rely on it: a claim takes a
-- transaction-scoped advisory lock per key and inserts only when no
-- partition holds the key. Partitions are named <table>_pYYYYMMDD; pgdedup's
-- janitor creates them ahead and drops those whose every record expired.

-- +goose Up
DO $$
DECLARE
    old   regclass := 'processed_messages'::regclass;
    nsp   text;
    name  text;
    lo    timestamptz;
    hi    timestamptz;
    d     date;
BEGIN
    IF (SELECT relkind FROM pg_class WHERE oid = old) = 'p' THEN
        RETURN;
    END IF;
    SELECT n.nspname, c.relname INTO nsp, name
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = old;
    EXECUTE format('LOCK TABLE %s IN EXCLUSIVE MODE', old);
    EXECUTE format('ALTER TABLE %s RENAME TO %I', old, name || '_unpartitioned');
    EXECUTE format('ALTER TABLE %s RENAME CONSTRAINT %I TO %I', old, name || '_pkey', name || '_unpartitioned_pkey');
    EXECUTE format('ALTER INDEX IF EXISTS %I.%I RENAME TO %I', nsp, name || '_expires_at_idx', name || '_unpartitioned_expires_at_idx');

    CREATE TABLE processed_messages (
        scope        text        NOT NULL,
        key          text        NOT NULL,
        payload_hash bytea       NOT NULL,
        processed_at timestamptz NOT NULL DEFAULT now(),
        expires_at   timestamptz NOT NULL,
        result       bytea,
        PRIMARY KEY (scope, key, processed_at)
    ) PARTITION BY RANGE (processed_at);

    EXECUTE format('SELECT min(processed_at), max(processed_at) FROM %s WHERE expires_at > now()', old) INTO lo, hi;
    FOR d IN SELECT generate_series(
            (coalesce(lo, now()) AT TIME ZONE 'UTC')::date::timestamp,
            greatest((coalesce(hi, now()) AT TIME ZONE 'UTC')::date, (now() AT TIME ZONE 'UTC')::date + 2)::timestamp,
            interval '1 day')::date
    LOOP
        EXECUTE format('CREATE TABLE %I.%I PARTITION OF %s FOR VALUES FROM (%L) TO (%L)',
            nsp, name || '_p' || to_char(d, 'YYYYMMDD'), 'processed_messages'::regclass,
            d::timestamp AT TIME ZONE 'UTC', (d + 1)::timestamp AT TIME ZONE 'UTC');
    END LOOP;

    EXECUTE format('INSERT INTO %s (scope, key, payload_hash, processed_at, expires_at, result)
        SELECT scope, key, payload_hash, processed_at, expires_at, result FROM %s WHERE expires_at > now()',
        'processed_messages'::regclass, old);
END
$$;

-- +goose Down
DO $$
DECLARE
    part  regclass := 'processed_messages'::regclass;
    nsp   text;
    name  text;
    old   regclass;
BEGIN
    IF (SELECT relkind FROM pg_class WHERE oid = part) <> 'p' THEN
        RETURN;
    END IF;
    SELECT n.nspname, c.relname INTO nsp, name
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = part;
    old := to_regclass(format('%I.%I', nsp, name || '_unpartitioned'));
    IF old IS NULL THEN
        EXECUTE format('CREATE TABLE %I.%I (LIKE %s INCLUDING DEFAULTS)', nsp, name || '_unpartitioned', part);
        old := to_regclass(format('%I.%I', nsp, name || '_unpartitioned'));
        EXECUTE format('ALTER TABLE %s ADD CONSTRAINT %I PRIMARY KEY (scope, key)', old, name || '_unpartitioned_pkey');
        EXECUTE format('CREATE INDEX %I ON %s USING brin (expires_at)', name || '_unpartitioned_expires_at_idx', old);
    END IF;
    EXECUTE format('LOCK TABLE %s IN EXCLUSIVE MODE', part);
    EXECUTE format('INSERT INTO %s (scope, key, payload_hash, processed_at, expires_at, result)
        SELECT scope, key, payload_hash, processed_at, expires_at, result FROM %s
        ON CONFLICT (scope, key) DO UPDATE SET payload_hash = excluded.payload_hash,
            processed_at = excluded.processed_at, expires_at = excluded.expires_at, result = excluded.result', old, part);
    EXECUTE format('DROP TABLE %s', part);
    EXECUTE format('ALTER TABLE %s RENAME TO %I', old, name);
    EXECUTE format('ALTER TABLE %s RENAME CONSTRAINT %I TO %I', old, name || '_unpartitioned_pkey', name || '_pkey');
    EXECUTE format('ALTER INDEX IF EXISTS %I.%I RENAME TO %I', nsp, name || '_unpartitioned_expires_at_idx', name || '_expires_at_idx');
END
$$;
