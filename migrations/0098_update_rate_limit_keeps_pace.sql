-- depends: 0097_waiter_queued_stop_park_unreserve
-- update_rate_limit ("each NULL keeps") wrote through set_rate_limit, which ends the pace a
-- header block set (report_rate_limit_exhausted: paced_requests_per_minute,
-- paced_requests_limit, paced_full_since) on every call: `runrow limits set KEY --input-tpm N`
-- wiped a pace the operator did not mention, and the key's waiting requests went at once into
-- the API's empty bucket. Both now write through runrow._set_rate_limit (functions/
-- set_rate_limit.sql), whose keep_pace keeps it when update_rate_limit is given no requests
-- limit. This migration is the version that says so (`runrow migrate` applies functions/
-- after it, and creates the new private function there).

COMMENT ON SCHEMA runrow IS
'runrow: durable AI-agent runs (migrations and functions/ of the runrow package; '
'runrow.schema_version() names the newest migration applied).';
