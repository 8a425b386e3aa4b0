-- depends: 0093_update_rate_limit
-- A 403 permission_error about one run's own request (a beta, a tool type, a file the
-- organisation may not use) reads as one about the key when its message does not name the
-- run's model (model.is_key_error): the run was deferred with its attempt given back, for
-- ever, and each of its retries blocked every run of the key again (report_key_error), a
-- deterministic failure tried again without end. The wording alone cannot tell the two apart
-- (the API's 403s share one type and no list of messages); the key's other runs can: when the
-- key answered another run's request since this run's last key error, and this run's request
-- is refused again, the refusal is this run's own.
--
-- The facts, under the key's row lock:
--   rate_limit.key_answers         how many key error streaks the key's probe ended by an
--                                  answer (_key_answered)
--   agent_run.key_error_answers    the key's key_answers when this run's request last got a key
--                                  error (report_key_error); NULL once its own request is
--                                  answered (a usage charged), so a later outage of the key is
--                                  a key error for it again
-- A counter, not a time: exact under the row lock whatever the transactions' start times.
-- report_key_error (functions/) takes own_request_possible, the worker's word that the error may
-- be about the request (a 403 permission_error; never a 401, a 402 or "credit balance", which a
-- key rotated half-way through the fleet or a credit spent again can repeat after an answer),
-- and then fails the run once when the key's count has grown past the run's, blocking nothing.
-- agent_run's column goes at the end of the row, behind the model-call columns (0080, 0084): a
-- claim, a heartbeat and a finish never write it.

ALTER TABLE runrow.agent_run
ADD COLUMN key_error_answers bigint;

ALTER TABLE runrow.rate_limit
ADD COLUMN key_answers bigint NOT NULL DEFAULT 0
CONSTRAINT rate_limit_key_answers_not_negative CHECK (key_answers >= 0);

COMMENT ON COLUMN runrow.agent_run.key_error_answers IS
'The rate_limit_key''s key_answers when this run''s request last got an API key or account '
'error (report_key_error); NULL once its own request is answered. A key error reported while '
'the key''s count has grown past it is the run''s own request''s: the run fails once.';
COMMENT ON COLUMN runrow.rate_limit.key_answers IS
'How many API key or account error streaks of the key ended with its probe answered: the key '
'worked for a request sent after the error (report_key_error compares it with the run''s '
'key_error_answers).';

-- 0073: a column is the auditor's only when granted.
GRANT SELECT (key_error_answers) ON runrow.agent_run TO runrow_auditor;

-- report_key_error gains own_request_possible (functions/report_key_error.sql defines it).
DROP FUNCTION IF EXISTS runrow.report_key_error(uuid, uuid, text, numeric, numeric);
