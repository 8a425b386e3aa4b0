-- Time-ordered keys for runs and messages. Random UUIDv4 keys put every insert on a random
-- leaf page of the primary keys of agent_run and message and of the journal's (run_id, seq)
-- key, so with history in the tables each run dirties pages all over those indexes (and
-- writes a full-page image of each right after a checkpoint). A UUIDv7 starts with the
-- millisecond of now(), so a run's rows land on the right edge of those indexes. PostgreSQL 15
-- has no uuidv7(); this one is built in SQL from the database clock and 74 random bits.
-- Existing ids are kept: only the defaults change (enqueue_run and retry_run use them).
-- depends: 0019_fleet_limits

CREATE FUNCTION runrow._uuidv7() RETURNS uuid
LANGUAGE sql
VOLATILE
PARALLEL SAFE
SET search_path = pg_catalog
AS $fn$
    -- A random v4 with its first 48 bits replaced by the Unix time in milliseconds, and its
    -- version nibble turned from 4 (0100) into 7 (0111) by setting bits 52 and 53.
    SELECT encode(
        set_bit(
            set_bit(
                overlay(
                    uuid_send(gen_random_uuid())
                    PLACING substring(int8send(floor(extract(EPOCH FROM now()) * 1000)::bigint) FROM 3)
                    FROM 1 FOR 6
                ),
                52, 1
            ),
            53, 1
        ),
        'hex'
    )::uuid
$fn$;

COMMENT ON FUNCTION runrow._uuidv7() IS
'A UUID version 7 (RFC 9562): the millisecond of now() (the database clock: the start of the '
'transaction) in its first 48 bits, then version 7, the RFC variant and 74 random bits. Keys '
'made by it sort by creation time, so inserts land on the right edge of an index; ids made in '
'one transaction share their time prefix and are unordered among themselves.';

REVOKE ALL ON FUNCTION runrow._uuidv7() FROM PUBLIC;

ALTER TABLE runrow.agent_run ALTER COLUMN id SET DEFAULT runrow._uuidv7();
ALTER TABLE runrow.message ALTER COLUMN id SET DEFAULT runrow._uuidv7();
