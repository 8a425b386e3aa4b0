-- API key and account errors (401 authentication_error, 402 billing_error, a 403 about the key,
-- the 400 "credit balance is too low") are about the key every run of the fleet sends, not
-- about one run: each run failed for good on its first request, and a revoked key or an empty
-- balance emptied the whole queue into `failed` within seconds. Such an error now blocks the
-- run's rate_limit_key as a 429 does (report_key_error), for a wait that grows while the error
-- persists; the run is deferred with its attempt given back.
--
-- The streak lives on the key's rate_limit row, under its lock:
--   key_error        the API's message of the latest report (what an operator reads)
--   key_errors       reports that each found the key still broken after its block: the streak
--   key_error_since  when the streak began
--   key_error_until  end of the streak's current block, or of the hold on the other runs while
--                    one probe request is out (acquire_model_call grants one request after the
--                    block and holds the key for one more block until it is answered)
--   key_error_block  that block's length, in seconds
--   key_probe_by     the run granted the probe; NULL while none is out
-- The first answer the key gets (a settled usage, append_step or record_usage) ends the streak.

ALTER TABLE runrow.rate_limit
ADD COLUMN key_error text,
ADD COLUMN key_errors integer NOT NULL DEFAULT 0,
ADD COLUMN key_error_since timestamptz,
ADD COLUMN key_error_until timestamptz,
ADD COLUMN key_error_block numeric,
ADD COLUMN key_probe_by uuid,
ADD CONSTRAINT rate_limit_key_error_streak CHECK (
    key_errors >= 0
    AND (key_errors = 0) = (key_error IS NULL)
    AND (key_error IS NULL) = (key_error_since IS NULL)
    AND (key_error IS NULL) = (key_error_until IS NULL)
    AND (key_error IS NULL) = (key_error_block IS NULL)
    AND (key_error IS NULL OR length(key_error) BETWEEN 1 AND 1000)
    AND (key_error_block IS NULL OR (key_error_block > 0 AND key_error_block <= 86400))
    AND (key_probe_by IS NULL OR key_error IS NOT NULL)
);

COMMENT ON COLUMN runrow.rate_limit.key_error IS
'The API''s message of the latest API key or account error reported for the key '
'(report_key_error); NULL once the key answered again.';
COMMENT ON COLUMN runrow.rate_limit.key_errors IS
'How many blocks in a row the key error has lasted (each report after a block ends grows the '
'next block); 0 when the key works.';

-- The views gain the streak (columns appended: CREATE OR REPLACE keeps the existing ones).
CREATE OR REPLACE VIEW runrow.rate_limit_blocks AS
SELECT
    l.rate_limit_key,
    l.blocked_until,
    l.blocked_until - now() AS time_left,
    l.blocked_by_run,
    l.blocks_reported,
    l.key_error,
    l.key_errors,
    l.key_error_since
FROM runrow.rate_limit AS l
WHERE l.blocked_until > now();

COMMENT ON VIEW runrow.rate_limit_blocks IS
'Rate-limit keys blocked now, with the time left: a 429 (report_rate_limited) or an API key or '
'account error (report_key_error: key_error is the API''s message, key_errors how many blocks '
'in a row it has lasted, key_error_since when it began).';

CREATE OR REPLACE VIEW runrow.rate_limits AS
WITH e AS (
    SELECT
        l.*,
        greatest(0, extract(EPOCH FROM now() - l.refilled_at)) AS secs
    FROM runrow.rate_limit AS l
)

SELECT
    e.rate_limit_key,
    e.requests_per_minute,
    e.input_tokens_per_minute,
    e.output_tokens_per_minute,
    least(e.requests_per_minute, e.requests_left + e.requests_per_minute * e.secs / 60) AS requests_left,
    least(e.input_tokens_per_minute, e.input_tokens_left + e.input_tokens_per_minute * e.secs / 60) AS input_tokens_left,
    least(e.output_tokens_per_minute, e.output_tokens_left + e.output_tokens_per_minute * e.secs / 60)
        AS output_tokens_left,
    CASE WHEN e.blocked_until > now() THEN e.blocked_until END AS blocked_until,
    CASE WHEN e.blocked_until > now() THEN e.blocked_until - now() END AS block_time_left,
    e.blocks_reported,
    e.key_error,
    e.key_errors
FROM e;

COMMENT ON VIEW runrow.rate_limits IS
'Every rate-limit key: its per-minute limits, what each bucket holds now, the block in force, '
'and an API key or account error that has not cleared (key_error, key_errors).';

-- A view replaced keeps its grants; said again so this file reads whole.
GRANT SELECT ON runrow.rate_limit_blocks, runrow.rate_limits TO runrow_auditor;
