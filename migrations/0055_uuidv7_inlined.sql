-- depends: 0054_tool_effect_rules_validated
-- _uuidv7 (every agent_run and message id, two per enqueue) as an SQL function with a
-- standard body (BEGIN ATOMIC) and no SET clause, so the planner inlines its expression into
-- the INSERT that takes the default, and a call costs the expression alone (issue 11).
--
-- Why: a function with a SET clause is never inlined and saves and restores the setting on
-- every call; 0027 made it PL/pgSQL for that reason, which still paid a function call and the
-- SET: about 5.5 us of a message INSERT's 24 (a loop of inserts, against gen_random_uuid()
-- as the default). The SET was there so that the names in the body could not be taken over by
-- a caller's search_path (a column default runs under whichever session inserts). A standard
-- body is parsed when the function is created and stored as a tree of resolved objects, so
-- the search_path of a later caller does not touch it: every name in the body is
-- schema-qualified, and \sf shows the objects it was bound to. (Not SET LOCAL search_path
-- around it: through a transaction pooler, its RESET returned the migrating transaction to the
-- server connection's default search_path instead of yoyo's, and yoyo's bookkeeping failed.)
--
-- Same expression (overlay and substr in their function form), same result: the millisecond of now(), version 7, the RFC variant and 74
-- random bits.

CREATE OR REPLACE FUNCTION runrow._uuidv7() RETURNS uuid
LANGUAGE sql
VOLATILE
PARALLEL SAFE
BEGIN ATOMIC
    -- A random v4 with its first 48 bits replaced by the Unix time in milliseconds, and its
    -- version nibble turned from 4 (0100) into 7 (0111) by setting bits 52 and 53. Every name
    -- is schema-qualified (the multiplication too), so what is bound at creation does not
    -- depend on the migrating session's search_path either.
    SELECT pg_catalog.encode(
        pg_catalog.set_bit(
            pg_catalog.set_bit(
                pg_catalog.overlay(
                    pg_catalog.uuid_send(pg_catalog.gen_random_uuid()),
                    pg_catalog.substr(
                        pg_catalog.int8send(
                            pg_catalog.floor(
                                pg_catalog.numeric_mul(extract(EPOCH FROM pg_catalog.now()), 1000)
                            )::bigint
                        ),
                        3
                    ),
                    1,
                    6
                ),
                52, 1
            ),
            53, 1
        ),
        'hex'
    )::pg_catalog.uuid;
END;
