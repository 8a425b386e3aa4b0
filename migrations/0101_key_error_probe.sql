-- depends: 0100_fire_schedules_pass
-- Three defects of the key error's "a 403 may be the run's own request" rules (migrations 0095,
-- 0099; the review of session 61). The functions are in functions/ (acquire_model_call,
-- report_key_error); this migration is the version that says so, and restates the columns the
-- rules read.
--
-- (A) The probe's choice. After a key error's block the first run to ask is the key's one probe
-- (acquire_model_call). A run whose own request draws the 403 and that the claim order favours
-- was the probe every time: each refusal doubled the block, nothing of the key was ever answered,
-- so the run never failed, and the key's other runs waited with it for ever. Now a run refused
-- with a 403 since the key's last answer (key_error_refused set, key_error_answers equal to the
-- key's key_answers) is told probe_elsewhere (15 s, it is deferred) while another run of the key
-- waits for the key; alone, it is still the probe.
--
-- (B) The lone run's rule. A run alone on its key, its probe refused with the same 403, failed once
-- the key's block had reached max_block_seconds: with key_error_max_block equal to
-- key_error_first_block (allowed) that was its second refusal, 5 s into a real outage. Now it
-- fails once the key's streak of refusals (key_error_since) began at least
-- greatest(max_block_seconds, 600 s) ago on the database clock.
--
-- (C) A second outage with the same 403 text. Refused again after the key answered, a run is
-- failed for its own request; a run left waiting by a first outage, made the probe of a second
-- one with the same text, was failed so, one per probe. Now only while the key works (no key
-- error since that answer, key_errors = 0): a refusal during a streak is the streak's.

COMMENT ON COLUMN runrow.rate_limit.key_error_since IS
'When the key''s current streak of API key or account errors began (report_key_error), by the '
'database clock; NULL while the key works. A run alone on its key whose probe is refused with '
'the same 403 fails once the streak began greatest(max_block_seconds, 600) seconds ago.';

COMMENT ON COLUMN runrow.agent_run.key_error_refused IS
'The 403 (report_key_error with own_request_possible; its first 1000 characters) this run''s '
'request last got as an API key or account error, or NULL when its last key error was another '
'(a 401, a 402, a credit balance). A refusal counts as the run''s own request''s only when it '
'is this same 403 again. While it is set and key_error_answers equals the key''s key_answers '
'(no answer since), acquire_model_call leaves the key''s probe to another run of the key '
'waiting for it (probe_elsewhere).';
