-- depends: 0086_report_rate_limit_exhausted
-- Two defects of the blocks a response's rate-limit headers report (report_rate_limit_exhausted).
--
-- (A) A rate block folded into a key error's hold was lifted with it. A key's block was one
-- end, blocked_until, the later of every block reported: a key error's probe answered
-- (_key_answered) ended it at now() when it was the hold's, and so also ended a rate block
-- reported in between (the probe's own answer saying requests-remaining: 0); the fleet then
-- sent into the empty bucket. The rate block (a 429's, a response's headers') now keeps its own
-- end, rate_blocked_until; blocked_until stays what every reader reads (the claim's skip of
-- blocked keys, acquire_model_call, defer_run, the views, queue_metrics): the later of the rate
-- block and the key error's hold, so a hold lifted leaves the rate block in force. A block in
-- force that is not the key error's own (it does not end at key_error_until) is a rate block.
--
-- (B) A header block released the fleet in a burst: when a block of one request back ended,
-- a key without a requests limit of its own (set_rate_limit) granted every waiting slot at
-- once, and they met the API's bucket together as 429s (bench/rate_limits.py, no limit set).
-- report_rate_limit_exhausted takes the header's requests limit (requests_limit, DEFAULT
-- NULL): the key's requests bucket then mirrors the API's after the block, refilling at its
-- pace (one request per reset_in_seconds) up to requests_limit, and the pace ends once it is
-- full (the API's bucket is full again: nobody drew on it for as long as that takes).
--   paced_requests_per_minute  the pace: 60 / reset_in_seconds
--   paced_requests_limit       the bucket's size under it: requests_limit
-- The function's new argument is a new signature: the old one goes (functions/ makes the new).

ALTER TABLE runrow.rate_limit
ADD COLUMN rate_blocked_until timestamptz,
ADD COLUMN paced_requests_per_minute numeric,
ADD COLUMN paced_requests_limit integer,
ADD CONSTRAINT rate_limit_paced CHECK (
    (paced_requests_per_minute IS NULL) = (paced_requests_limit IS NULL)
    AND (paced_requests_per_minute IS NULL OR (paced_requests_per_minute > 0 AND paced_requests_per_minute <= 60000))
    AND (paced_requests_limit IS NULL OR paced_requests_limit > 0)
);

COMMENT ON COLUMN runrow.rate_limit.rate_blocked_until IS
'The end of the key''s latest rate block (a 429: report_rate_limited; a response''s headers: '
'report_rate_limit_exhausted), kept apart from a key error''s hold (key_error_until) so that '
'lifting the hold leaves it in force. blocked_until is the later of the two.';
COMMENT ON COLUMN runrow.rate_limit.paced_requests_per_minute IS
'For a key with no requests_per_minute of its own, after a header block (report_rate_limit_exhausted '
'with requests_limit): the refill rate of its requests bucket, the API''s pace, so waiting '
'requests are granted one at a time, not all at the block''s end. NULL: not paced.';
COMMENT ON COLUMN runrow.rate_limit.paced_requests_limit IS
'The size of the paced requests bucket (the header''s requests limit): the pace ends when it is '
'full, as the API''s bucket is then.';

-- A block in force that is not the key error's own is a rate block (0074's reading of it).
UPDATE runrow.rate_limit AS l
SET rate_blocked_until = l.blocked_until
WHERE l.blocked_until > now() AND l.blocked_until IS DISTINCT FROM l.key_error_until;

DROP FUNCTION IF EXISTS runrow.report_rate_limit_exhausted(uuid, uuid, numeric);
