-- depends: 0065_money_is_finite
-- fail_webhook_delivery takes permanent (default false): a failure that will recur identically
-- (a webhook_url no request can be built for) is dead-lettered on this attempt, whatever
-- max_attempts says. The sender used to get that by passing max_attempts => the attempt's
-- number, which said what it did but not why. A function's arguments cannot be added in place
-- (CREATE OR REPLACE would add an overload beside it), so the old signature goes here and
-- functions/fail_webhook_delivery.sql creates the new one, as every migrate re-applies
-- functions/ after the migrations. Calls by name and by position keep working unchanged. IF
-- EXISTS: on a fresh install functions/ has not created it yet.

DROP FUNCTION IF EXISTS runrow.fail_webhook_delivery(uuid, uuid, text, integer, integer, numeric);
