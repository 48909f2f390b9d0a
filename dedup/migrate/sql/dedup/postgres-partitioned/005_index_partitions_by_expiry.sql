-- idemq: a BRIN index on expires_at for the partitioned processed-message
-- table (migration 004), so that pgdedup's janitor finds a partition with no
-- unexpired record without reading it: before it drops a day's partition it
-- looks for a record whose expires_at is still ahead, and the index leaves
-- out every block range whose records all expired. Applied with 004
-- (migrate.Config.Partitioned, `idemq migrate --partitioned`).
--
-- The index is made on the parent, so every partition has one: the table
-- that 004 turned into the first partition keeps the one of migration 001
-- (processed_messages_expires_at_idx, attached without a build), and the
-- partitions that the janitor attaches later get theirs at ATTACH
-- PARTITION. autosummarize has autovacuum summarize each block range once
-- inserts moved past it, rather than at the partition's next vacuum; a range
-- never summarized is read by the check (what it answers is the same).
--
-- Locks: CREATE INDEX takes a SHARE lock on the table and on each
-- partition until it commits; claims (inserts) wait, reads do not. Right
-- after 004 the partitions other than the first are empty, and the first
-- one's index is attached as it is: a few catalog changes. On a table that
-- 004 partitioned earlier, the index of each partition that holds records
-- is built meanwhile, which reads the partition once (about as long as a
-- sequential scan of it).

-- +goose Up
CREATE INDEX IF NOT EXISTS processed_messages_expiry_idx
    ON processed_messages USING brin (expires_at) WITH (autosummarize = on);

-- +goose Down
-- Dropping the parent's index drops every partition's: the first partition
-- gets 001's back, as 004's Down expects it.
DO $$
DECLARE
    t      regclass := 'processed_messages'::regclass;
    nsp    text;
    name   text;
    legacy regclass;
BEGIN
    SELECT n.nspname, c.relname INTO nsp, name
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = t;
    EXECUTE format('DROP INDEX IF EXISTS %I.%I', nsp, name || '_expiry_idx');
    SELECT i.inhrelid INTO legacy FROM pg_inherits AS i JOIN pg_class AS c ON c.oid = i.inhrelid
        WHERE i.inhparent = t AND pg_get_expr(c.relpartbound, c.oid) LIKE 'FOR VALUES FROM (MINVALUE)%';
    IF legacy IS NOT NULL THEN
        EXECUTE format('CREATE INDEX IF NOT EXISTS %I ON %s USING brin (expires_at)', name || '_expires_at_idx', legacy);
    END IF;
END
$$;
