-- depends: 0106_lapsed_token_rule_and_429s_reported
-- Three defects of a key error's "a 403 may be the run's own request" rules (migration 0101; the
-- review of session 61, pgtap/key_error_answerer.sql). The functions are in functions/
-- (acquire_model_call, report_key_error, and the helper they now share,
-- _key_has_other_answerer in _key_has_other_answerer.sql); this migration is the version that says
-- so, and adds the column the third fix reads.
--
-- (1) report_key_error's lone-run rule counted every other queued or running run of the key,
-- the run's own conversation's next turn too: that turn waits behind the run (acquire_model_call
-- rightly ignored it), so the run was refused for ever and the turn never started.
-- (2) Two runs refused with the same own-request 403 never ended: each was the probe in turn
-- (acquire_model_call ignores a run refused since the key's last answer), and each refusal found
-- the other open. Both functions now ask one question (_key_has_other_answerer): is there another
-- run of the key that could answer, in another conversation, running or queued, not behind a
-- turn of its own and due within 15 s of the key's block's end, and not itself refused a 403
-- since the key's last answer. A run refused with the same 403 again with no such other run
-- fails once the key's streak is greatest(max_block_seconds, 600) s old, however many runs of
-- the key are refused so: a 403 that has lasted that long is not going to clear.
-- (3) probe_elsewhere could defer a run without limit to a queued run the claim never hands out
-- (its concurrency_key full with another key's running run): nobody probed the key, one claim
-- and one run_requeued every 15 s for as long as that lasted. Once the key's streak is that old
-- and its last block ended over 15 s ago with no probe since, the refused run is the probe
-- whatever else waits. acquire_model_call is not given max_block_seconds: report_key_error keeps
-- what it was last given on the key's row (below), so both sides use the same bound.

ALTER TABLE runrow.rate_limit
ADD COLUMN key_error_max_block numeric;

COMMENT ON COLUMN runrow.rate_limit.key_error_max_block IS
'The max_block_seconds report_key_error was last given for the key''s streak of API key or '
'account errors (NULL before migration 0107 or any key error; left as it is when the key '
'answers: read only during a streak). acquire_model_call''s bound on probe_elsewhere: once the '
'streak (key_error_since) is greatest(key_error_max_block, 600) s old, a run refused with a 403 '
'since the key''s last answer is the probe whatever else of the key waits.';

COMMENT ON COLUMN runrow.rate_limit.key_error_since IS
'When the key''s current streak of API key or account errors began (report_key_error), by the '
'database clock; NULL while the key works. A run whose probe is refused with the same 403, no '
'other run of the key able to answer (_key_has_other_answerer), fails once the streak began '
'greatest(max_block_seconds, 600) seconds ago; from then on a run refused with a 403 since the '
'key''s last answer is no longer told probe_elsewhere once the key''s block has been over 15 s.';

COMMENT ON COLUMN runrow.agent_run.key_error_refused IS
'The 403 (report_key_error with own_request_possible; its first 1000 characters) this run''s '
'request last got as an API key or account error, or NULL when its last key error was another '
'(a 401, a 402, a credit balance). A refusal counts as the run''s own request''s only when it '
'is this same 403 again. While it is set and key_error_answers equals the key''s key_answers '
'(no answer since), acquire_model_call leaves the key''s probe to another run of the key that '
'could answer (probe_elsewhere), and the run does not count as one (_key_has_other_answerer).';
