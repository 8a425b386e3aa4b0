CREATE OR REPLACE FUNCTION runrow.claim_webhook_deliveries(
    worker_id text DEFAULT NULL,
    max_deliveries integer DEFAULT 10,
    lease_seconds integer DEFAULT 30,
    max_attempts integer DEFAULT 8,
    max_per_receiver integer DEFAULT 4
)
RETURNS TABLE (
    delivery_id uuid,
    claim_token uuid,
    run_id uuid,
    url text,
    payload jsonb,
    attempt integer,
    claim_expires_at timestamptz,
    claimed_at timestamptz
)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, runrow, pg_temp
AS $fn$
DECLARE
    -- The due deliveries a sweep reads: the first what was asked for (the common case: as many as
    -- the claim read before the cap); each later one 100 more, so up to 100 held back (their
    -- receiver full) at the head of the queue do not hide the rest.
    walk integer := claim_webhook_deliveries.max_deliveries;
    got integer := 0;
    n integer;
    walked integer;
    -- All sweeps of a claim read at most this many due deliveries.
    max_read constant integer := 10000;
    read_so_far integer := 0;
    -- Where the sweeps have read to, in due order (next_attempt_at, id): each sweep reads on after
    -- it, so it never reads the held-back head again and nothing has to be moved aside.
    after_at timestamptz := '-infinity';
    after_id uuid := '00000000-0000-0000-0000-000000000000';
    grp record;
    -- Set when the sweeps stopped at max_read with deliveries still due: one more pass walks the
    -- receivers instead (webhook_delivery_pending_by_receiver), at most max_receivers of them,
    -- from a random point of their order, so every receiver is reached over a few claims.
    walking boolean := false;
    max_receivers constant integer := 1000;
    start text;
BEGIN
    IF length(claim_webhook_deliveries.worker_id) > 200 THEN
        RAISE EXCEPTION 'worker_id must be NULL or at most 200 characters' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Kept on the delivery and in its error (claimed by ...): no control character.
    IF NOT runrow._printable(claim_webhook_deliveries.worker_id) THEN
        PERFORM runrow._require_printable(claim_webhook_deliveries.worker_id, 'worker_id');
    END IF;
    -- Each _require_* helper only raises, and a PERFORM is a statement: called only when the
    -- test before it fails, in the arguments' order, so the first bad one is still named.
    IF claim_webhook_deliveries.max_deliveries IS NULL OR claim_webhook_deliveries.max_deliveries NOT BETWEEN 1 AND 1000
       OR claim_webhook_deliveries.lease_seconds IS NULL OR claim_webhook_deliveries.lease_seconds NOT BETWEEN 1 AND 3600
       OR claim_webhook_deliveries.max_attempts IS NULL OR claim_webhook_deliveries.max_attempts NOT BETWEEN 1 AND 100
       OR claim_webhook_deliveries.max_per_receiver IS NULL
       OR claim_webhook_deliveries.max_per_receiver NOT BETWEEN 1 AND 1000 THEN
        PERFORM runrow._require_range(claim_webhook_deliveries.max_deliveries, 'max_deliveries', 1, 1000);
        PERFORM runrow._require_range(claim_webhook_deliveries.lease_seconds, 'lease_seconds', 1, 3600);
        PERFORM runrow._require_range(claim_webhook_deliveries.max_attempts, 'max_attempts', 1, 100);
        PERFORM runrow._require_range(claim_webhook_deliveries.max_per_receiver, 'max_per_receiver', 1, 1000);
    END IF;

    -- Sweep 0 reads the first max_deliveries due deliveries in due order (the receiver computed
    -- only for those), grouped by receiver (_webhook_receiver) in the order of each one's first;
    -- the common case ends there. A later sweep only when the one before read all it could and
    -- leased too few (receivers full, or another claim's): it reads on from where the last one
    -- stopped, twice as many (max_deliveries + 100 first), until max_read in all. Nothing is
    -- written to the deliveries it passes over: stop 57 first moved them aside (next_attempt_at
    -- at their receiver's first lease end), which made a healthy receiver with a backlog drain 4
    -- a lease (10 times slower) and churned 600,000 row versions in 6 minutes behind a hanging
    -- receiver (the review).
    FOR sweep IN 0..20 LOOP
        walked := 0;
        FOR grp IN
            WITH RECURSIVE receivers AS (
                -- The walk: receivers with a pending delivery in their text order, from the first
                -- after `start` to the last, then from the first up to `start` (wrapped), one
                -- index descent each (_next_webhook_receiver).
                SELECT coalesce(a.first, b.first) AS receiver, 1 AS n, a.first IS NULL AS wrapped
                FROM (SELECT runrow._next_webhook_receiver(start) AS first) AS a,
                    (SELECT runrow._next_webhook_receiver('') AS first) AS b
                WHERE walking
                UNION ALL
                SELECT
                    CASE WHEN nx.receiver IS NOT NULL THEN nx.receiver
                        WHEN NOT r.wrapped THEN runrow._next_webhook_receiver('') END,
                    r.n + 1,
                    r.wrapped OR nx.receiver IS NULL
                FROM receivers AS r
                CROSS JOIN LATERAL (SELECT runrow._next_webhook_receiver(r.receiver) AS receiver) AS nx
                WHERE r.receiver IS NOT NULL AND r.n < max_receivers AND NOT (r.wrapped AND r.receiver > start)
            )

            SELECT
                d.receiver,
                array_agg(d.id ORDER BY d.next_attempt_at, d.id) AS ids,
                max(d.next_attempt_at) AS last_at,
                (array_agg(d.id ORDER BY d.next_attempt_at DESC, d.id DESC))[1] AS last_id,
                min(d.next_attempt_at) AS first_at
            FROM (
                SELECT w.id, w.next_attempt_at, runrow._webhook_receiver(w.url) AS receiver
                FROM (
                    SELECT v.id, v.url, v.next_attempt_at
                    FROM runrow.webhook_delivery AS v
                    WHERE NOT walking AND v.state = 'pending' AND v.next_attempt_at <= now()
                      AND (v.next_attempt_at, v.id) > (after_at, after_id)
                    ORDER BY v.next_attempt_at, v.id
                    LIMIT walk
                ) AS w
            ) AS d
            GROUP BY d.receiver
            UNION ALL
            SELECT x.receiver, x.ids, NULL, NULL, NULL
            FROM (
                SELECT
                    r.receiver,
                    ARRAY(
                        SELECT v.id FROM runrow.webhook_delivery AS v
                        WHERE runrow._webhook_receiver(v.url) = r.receiver
                          AND v.state = 'pending' AND v.next_attempt_at <= now()
                        ORDER BY v.next_attempt_at
                        LIMIT claim_webhook_deliveries.max_per_receiver
                    ) AS ids
                FROM receivers AS r
                -- Come round again past `start`: visited already.
                WHERE r.receiver IS NOT NULL AND NOT (r.wrapped AND r.receiver > start)
            ) AS x
            WHERE cardinality(x.ids) > 0
            ORDER BY 5
        LOOP
            -- Complete unless the loop ends early, and then the claim has all it asked for.
            walked := walked + cardinality(grp.ids);
            -- The cursor was opened with the sweep's start: moving the mark now changes what the
            -- next sweep reads, not this one. (The walk's rows have no mark.)
            IF NOT walking AND (grp.last_at, grp.last_id) > (after_at, after_id) THEN
                after_at := grp.last_at;
                after_id := grp.last_id;
            END IF;
            EXIT WHEN got >= claim_webhook_deliveries.max_deliveries;
            -- One claim at a time leases to a receiver: its count of the receiver's leases and
            -- its own leases commit together before another claim counts. The count is in a
            -- statement after the lock, so it sees every lease committed before the lock was
            -- granted. A receiver another claim holds is passed over, never waited for (its due
            -- deliveries stay due).
            CONTINUE WHEN NOT pg_try_advisory_xact_lock(hashtext('runrow.webhook_receiver'), hashtext(grp.receiver));
            RETURN QUERY
            SELECT l.* FROM runrow._lease_webhook_deliveries(
                grp.receiver, grp.ids, claim_webhook_deliveries.max_deliveries - got,
                claim_webhook_deliveries.worker_id, claim_webhook_deliveries.lease_seconds,
                claim_webhook_deliveries.max_attempts, claim_webhook_deliveries.max_per_receiver
            ) AS l;
            GET DIAGNOSTICS n = ROW_COUNT;
            got := got + n;
        END LOOP;

        -- Done when asked for no more, when the sweep read everything due, or after the walk.
        EXIT WHEN got >= claim_webhook_deliveries.max_deliveries OR walked < walk OR walking;
        read_so_far := read_so_far + walked;
        IF read_so_far >= max_read THEN
            -- Still due past max_read: walk the receivers instead, from a random point of
            -- their order ("http://" or "https://" and a character a host may begin with).
            walking := true;
            start := (ARRAY['http://', 'https://'])[1 + floor(random() * 2)::integer]
                || chr(48 + floor(random() * 75)::integer);
            CONTINUE;
        END IF;
        walk := least(greatest(walk * 2, claim_webhook_deliveries.max_deliveries + 100), max_read - read_so_far);
    END LOOP;
END
$fn$;

COMMENT ON FUNCTION runrow.claim_webhook_deliveries(text, integer, integer, integer, integer) IS
'Lease up to max_deliveries (1..1000) due webhook deliveries (pending, next_attempt_at passed: '
'never tried, backoff over, or a lapsed lease) in due order, FOR UPDATE SKIP LOCKED, so any '
'number of workers may call it at once and no delivery goes to two of them while its lease '
'(lease_seconds, 1..3600) lives. Each comes back with a fresh claim_token, attempt = attempts '
'so far including this one, the body to POST, and claimed_at (the database clock, for the '
'signature''s timestamp). A delivery that already used max_attempts '
'(1..100; the last one''s worker died) is dead-lettered instead of returned. Record the '
'outcome with complete_webhook_delivery or fail_webhook_delivery; a lease that lapses without '
'one is taken over by the next claim, with the same delivery id. '
'max_per_receiver (1..1000, default 4): no delivery is leased whose receiver '
'(_webhook_receiver: scheme://host:port, case-folded) already has that many unexpired leases, '
'counted over the whole fleet; one claim at a time leases to a receiver (a transaction advisory '
'lock, tried, never waited for: a receiver another claim holds is passed over), so concurrent '
'claims in READ COMMITTED (a caller in REPEATABLE READ counts on its older snapshot) never '
'exceed it together. A claim reads the first max_deliveries due deliveries and, when it could '
'lease too few of them, reads on in due order (sweeps of max_deliveries + 100, doubling), at '
'most 10000 due deliveries in all, writing nothing to those it passes over; when those are not '
'all, it walks the receivers that have a pending delivery instead (up to 1000, from a random '
'point of their order, one descent of webhook_delivery_pending_by_receiver each) and leases the '
'due ones of those with room, so no backlog at a full receiver holds the others back.';

REVOKE ALL ON FUNCTION runrow.claim_webhook_deliveries(text, integer, integer, integer, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runrow.claim_webhook_deliveries(text, integer, integer, integer, integer) TO runrow_worker;
