-- idemq: the outbox table partitioned by day (UTC) of created_at, for a
-- relay with outbox.Config.Partitioned. Applied only when asked for
-- (migrate.Config.Partitioned, `idemq migrate --partitioned`); an
-- unpartitioned table keeps working as before without it.
--
-- No row is copied: the table becomes the first partition of a partitioned
-- table that takes its name, covering every time before the cut (the start
-- of the day after tomorrow, UTC); the partitions of later days are
-- created by the relay's cleanup, which drops a partition once it holds no
-- pending, parked or retained row. Attaching the table builds a unique
-- index on (seq, created_at) and an index on id, and reads the table to
-- prove every row is before the cut, while writes wait.
--
-- The primary key includes created_at (PostgreSQL enforces uniqueness only
-- within a partition): seq still comes from the table's one sequence and
-- orders every row. id is no longer unique across partitions: a reply
-- takes an advisory lock on its id and inserts only when no row has it.

-- +goose Up
DO $$
DECLARE
    t      regclass := 'idemq_outbox'::regclass;
    legacy text;
    cut    timestamptz := ((now() AT TIME ZONE 'UTC')::date + 2)::timestamp AT TIME ZONE 'UTC';
    idx    text;
BEGIN
    IF (SELECT relkind FROM pg_class WHERE oid = t) = 'p' THEN
        RETURN;
    END IF;
    legacy := 'idemq_outbox_p' || to_char((cut AT TIME ZONE 'UTC')::date - 1, 'YYYYMMDD');
    LOCK TABLE idemq_outbox IN SHARE ROW EXCLUSIVE MODE;
    CREATE UNIQUE INDEX idemq_outbox_partition_idx ON idemq_outbox (seq, created_at);
    CREATE INDEX idemq_outbox_id_idx ON idemq_outbox (id);
    EXECUTE format('ALTER TABLE idemq_outbox ADD CONSTRAINT idemq_outbox_partition_bound CHECK (created_at < %L)', cut);
    DROP TRIGGER IF EXISTS idemq_outbox_notify ON idemq_outbox;
    ALTER TABLE idemq_outbox DROP CONSTRAINT idemq_outbox_pkey;
    ALTER TABLE idemq_outbox ADD CONSTRAINT idemq_outbox_legacy_pkey PRIMARY KEY USING INDEX idemq_outbox_partition_idx;
    FOREACH idx IN ARRAY ARRAY['pending_idx', 'pending_seq_idx', 'source_key_idx', 'sent_at_idx', 'id_idx'] LOOP
        EXECUTE format('ALTER INDEX %I RENAME TO %I', 'idemq_outbox_' || idx, legacy || '_' || idx);
    END LOOP;
    EXECUTE format('ALTER TABLE idemq_outbox RENAME TO %I', legacy);

    CREATE TABLE idemq_outbox (
        seq             bigint      NOT NULL DEFAULT nextval('idemq_outbox_seq_seq'),
        id              text        NOT NULL,
        source_key      text,
        destination     text        NOT NULL,
        partition_key   text        NOT NULL DEFAULT '',
        headers         text        NOT NULL DEFAULT '{}',
        body            bytea       NOT NULL,
        created_at      timestamptz NOT NULL DEFAULT now(),
        state           smallint    NOT NULL DEFAULT 0,
        attempts        integer     NOT NULL DEFAULT 0,
        last_error      text,
        next_attempt_at timestamptz,
        sent_at         timestamptz,
        routing_key     text        NOT NULL DEFAULT '',
        PRIMARY KEY (seq, created_at)
    ) PARTITION BY RANGE (created_at);
    -- The sequence outlives the first partition's drop.
    ALTER SEQUENCE idemq_outbox_seq_seq OWNED BY idemq_outbox.seq;
    CREATE INDEX idemq_outbox_pending_idx ON idemq_outbox (partition_key, seq) WHERE state = 0;
    CREATE INDEX idemq_outbox_pending_seq_idx ON idemq_outbox (seq) WHERE state = 0;
    CREATE INDEX idemq_outbox_source_key_idx ON idemq_outbox (source_key) WHERE source_key IS NOT NULL;
    CREATE INDEX idemq_outbox_sent_at_idx ON idemq_outbox (sent_at) WHERE state = 1;
    CREATE INDEX idemq_outbox_id_idx ON idemq_outbox (id);
    CREATE TRIGGER idemq_outbox_notify AFTER INSERT ON idemq_outbox
        FOR EACH STATEMENT EXECUTE FUNCTION idemq_outbox_notify();
    EXECUTE format('ALTER TABLE idemq_outbox ATTACH PARTITION %I FOR VALUES FROM (MINVALUE) TO (%L)', legacy, cut);
    EXECUTE format('ALTER TABLE %I DROP CONSTRAINT idemq_outbox_partition_bound', legacy);
END
$$;

-- +goose Down
DO $$
BEGIN
    IF (SELECT relkind FROM pg_class WHERE oid = 'idemq_outbox'::regclass) <> 'p' THEN
        RETURN;
    END IF;
    LOCK TABLE idemq_outbox IN ACCESS EXCLUSIVE MODE;
    CREATE TABLE idemq_outbox_unpartitioned (LIKE idemq_outbox INCLUDING DEFAULTS);
    INSERT INTO idemq_outbox_unpartitioned SELECT * FROM idemq_outbox;
    ALTER SEQUENCE idemq_outbox_seq_seq OWNED BY idemq_outbox_unpartitioned.seq;
    DROP TABLE idemq_outbox;
    ALTER TABLE idemq_outbox_unpartitioned RENAME TO idemq_outbox;
    ALTER TABLE idemq_outbox ADD CONSTRAINT idemq_outbox_pkey PRIMARY KEY (seq);
    ALTER TABLE idemq_outbox ADD CONSTRAINT idemq_outbox_id_key UNIQUE (id);
    CREATE INDEX idemq_outbox_pending_idx ON idemq_outbox (partition_key, seq) WHERE state = 0;
    CREATE INDEX idemq_outbox_pending_seq_idx ON idemq_outbox (seq) WHERE state = 0;
    CREATE INDEX idemq_outbox_source_key_idx ON idemq_outbox (source_key) WHERE source_key IS NOT NULL;
    CREATE INDEX idemq_outbox_sent_at_idx ON idemq_outbox (sent_at) WHERE state = 1;
    CREATE TRIGGER idemq_outbox_notify AFTER INSERT ON idemq_outbox
        FOR EACH STATEMENT EXECUTE FUNCTION idemq_outbox_notify();
END
$$;
