-- depends: 0114_rate_limit_blocked_until_indexed
-- The keys in a key-error streak, read through a partial index instead of every key's row.
--
-- Why: queue_metrics' rate_limit_keys_key_error counts `key_errors > 0`, and the workers'
-- metrics read queue_metrics on every scrape. rate_limit keeps a row for every key ever given
-- limits or ever blocked (see 0114), so each scrape read all of them: 3,010 rows at 3,010 keys
-- (tests/test_blocked_keys_lookup.py). Found beside 0114 (stop 62).
--
-- Writes: only an UPDATE that changes key_errors loses HOT: report_key_error starting or
-- lengthening a streak and _key_answered ending one (a key error's own writes). The per-request
-- bucket writes leave key_errors as it is and stay HOT (the same test pins it).

CREATE INDEX rate_limit_key_errors ON runrow.rate_limit (rate_limit_key) WHERE key_errors > 0;

COMMENT ON INDEX runrow.rate_limit_key_errors IS
'The keys in a key-error streak (key_errors > 0): queue_metrics.rate_limit_keys_key_error counts '
'them without reading every key ever limited or blocked.';
