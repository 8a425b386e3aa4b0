-- depends: 0077_queue_metrics_key_errors
-- A cap on the webhook deliveries in flight to one receiver, fleet-wide (claim_webhook_deliveries'
-- new max_per_receiver, functions/claim_webhook_deliveries.sql). Without it a receiver that
-- hangs to the timeout, with many deliveries due, took every sender slot in turn: the audit's 40
-- deliveries to one such receiver delayed another receiver's from 0.56 s to 8.7 s.
--
-- A receiver is where the request goes: the URL's scheme, host and port (_webhook_receiver).
-- The claim counts a receiver's unexpired leases through webhook_delivery_leased, an index of
-- the leased rows only (at most the fleet's sender slots, plus lapsed leases not yet taken
-- over), so the count costs the same however many deliveries the table holds.
--
-- No table rewrite and no ACCESS EXCLUSIVE lock: the function is new, and the index is a partial
-- one. Building it reads the table once under a SHARE lock, which holds back writes of
-- webhook_delivery (run endings with a webhook, claims, outcomes) while it lasts, not reads:
-- 0.3 to 0.5 s for 1,000,000 delivered rows (1.4 GB) read from the OS cache, longer from disk.
-- To avoid even that on a large table, run the function's statement below and then
-- CREATE INDEX CONCURRENTLY with this index's definition before migrating (README, "Install the
-- schema"): CREATE OR REPLACE and IF NOT EXISTS then leave both as they are.
--
-- The old four-argument claim goes here and functions/ creates the five-argument one (CREATE OR
-- REPLACE would add an overload beside it, 0066's reason); calls by name or position with four
-- arguments or fewer keep working unchanged. IF EXISTS: a fresh install has not created it yet.

-- Defined in this migration, not in functions/ (re-applied on every migrate): the index below is
-- built on it, and a changed body would leave the index answering for the old one. A change
-- needs a migration that replaces the function and rebuilds the index (REINDEX).
CREATE OR REPLACE FUNCTION runrow._webhook_receiver(url text)
RETURNS text
LANGUAGE plpgsql
IMMUTABLE
PARALLEL SAFE
AS $fn$
DECLARE
    -- What follows // up to the path, query or fragment, without the user info (up to the last
    -- @). String functions, not a regex with captures: one of those cost 10 to 18 us a URL, this
    -- 3.5 us, and a claim computes it for every due delivery it reads. Never raises (an index
    -- expression that raised would fail the claim that leases the row, for every worker): a URL
    -- outside _webhook_url_ok's grammar, which only a row older than that check can hold, still
    -- gets a receiver, whatever its parts say.
    authority text := split_part(split_part(substring(url FROM '^[^/]*//[^/?#]*'), '//', 2), '@', -1);
    host text;
    port text;
BEGIN
    IF left(authority, 1) = '[' THEN
        host := split_part(authority, ']', 1) || ']';
    ELSE
        host := split_part(authority, ':', 1);
    END IF;
    port := ltrim(substr(authority, length(host) + 2), '0');
    IF port = '' THEN
        port := CASE
            WHEN substr(authority, length(host) + 2) <> '' THEN '0'
            WHEN lower(split_part(url, ':', 1)) = 'https' THEN '443'
            ELSE '80'
        END;
    END IF;
    -- example.com. is example.com, fully qualified.
    IF right(host, 1) = '.' AND length(host) > 1 THEN
        host := left(host, -1);
    END IF;
    RETURN lower(split_part(url, ':', 1)) || '://' || lower(host) || ':' || port;
END
$fn$;

COMMENT ON FUNCTION runrow._webhook_receiver(text) IS
'The receiver of a webhook_url, the unit of claim_webhook_deliveries'' max_per_receiver: '
'scheme://host:port, case-folded, the port given or the scheme''s (80, 443), user info and one '
'trailing dot of the host left out, path and query ignored. So http://A.example/x and '
'http://a.example:80/y are one receiver; two names or two addresses of one server are two. '
'Never raises. '
'Index webhook_delivery_leased is built on it: changing it needs a migration that rebuilds the index.';

REVOKE ALL ON FUNCTION runrow._webhook_receiver(text) FROM PUBLIC;

-- The leases, by receiver: the claim's count of a receiver's deliveries in flight.
CREATE INDEX IF NOT EXISTS webhook_delivery_leased
ON runrow.webhook_delivery (runrow._webhook_receiver(url), claim_expires_at)
WHERE claim_token IS NOT NULL;

DROP FUNCTION IF EXISTS runrow.claim_webhook_deliveries(text, integer, integer, integer);
