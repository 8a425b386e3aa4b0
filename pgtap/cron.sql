-- The cron evaluation behind the schedules (functions/_schedule_helpers.sql): parsing with
-- errors that name cron, the next and previous tick at fixed instants (pgTAP cannot move
-- now(), so the functions take the instant), Vixie's day-of-month/day-of-week rule, and a
-- brute-force cross-check of both walks against a minute-by-minute scan.
BEGIN;
\ir helpers/setup.psql
SELECT plan(43);

CREATE FUNCTION pg_temp.nxt(cron text, after timestamptz) RETURNS timestamptz LANGUAGE sql AS $$
    SELECT runrow._cron_next(runrow._cron_parse(cron), after)
$$;
CREATE FUNCTION pg_temp.prv(cron text, at timestamptz, not_before timestamptz DEFAULT NULL)
RETURNS timestamptz LANGUAGE sql AS $$
    SELECT runrow._cron_prev(runrow._cron_parse(cron), at, not_before)
$$;

-- Parsing.
SELECT is((runrow._cron_parse('*/15 0,12 1-3 * *')).minutes, ARRAY[0, 15, 30, 45], 'steps over *');
SELECT is((runrow._cron_parse('*/15 0,12 1-3 * *')).hours, ARRAY[0, 12], 'lists');
SELECT is((runrow._cron_parse('*/15 0,12 1-3 * *')).doms, ARRAY[1, 2, 3], 'ranges');
SELECT is((runrow._cron_parse('10-30/10 * * * *')).minutes, ARRAY[10, 20, 30], 'a range with a step');
SELECT is((runrow._cron_parse('50/5 * * * *')).minutes, ARRAY[50, 55], 'N/S runs from N to the field''s maximum');
SELECT is((runrow._cron_parse('0 0 * JAN,jul-Sep *')).months, ARRAY[1, 7, 8, 9], 'month names, any case, in ranges');
SELECT is((runrow._cron_parse('0 0 * * mon-fri')).dows, ARRAY[1, 2, 3, 4, 5], 'weekday names');
SELECT is((runrow._cron_parse('0 0 * * 5-7')).dows, ARRAY[0, 5, 6], '7 is Sunday, as 0 is');
SELECT is((runrow._cron_parse(' @daily ')).minutes || (runrow._cron_parse('@daily')).hours, ARRAY[0, 0],
    '@daily is 0 0 * * * (surrounding blanks ignored)');
SELECT is(((runrow._cron_parse('0 0 * * 1')).dom_star, (runrow._cron_parse('0 0 * * 1')).dow_star), (true, false),
    'dom_star/dow_star record which day field starts with *');

-- Bad input: 22023 (22004 for NULL), and the message names cron.
SELECT throws_ok($$SELECT runrow._cron_parse(NULL)$$, '22004', 'cron must not be NULL', 'NULL cron');
SELECT throws_ok($$SELECT runrow._cron_parse('* * * *')$$, '22023',
    'cron "* * * *" must have five fields (minute hour day-of-month month day-of-week, UTC), got 4', 'four fields');
SELECT throws_ok($$SELECT runrow._cron_parse('')$$, '22023',
    'cron "" must have five fields (minute hour day-of-month month day-of-week, UTC), got 0', 'empty');
SELECT throws_ok($$SELECT runrow._cron_parse('60 * * * *')$$, '22023',
    'cron "60 * * * *": minute 60 is out of range 0-59', 'minute out of range');
SELECT throws_ok($$SELECT runrow._cron_parse('* * 0 * *')$$, '22023',
    'cron "* * 0 * *": day-of-month 0 is out of range 1-31', 'day-of-month out of range');
SELECT throws_ok($$SELECT runrow._cron_parse('* * * * 8')$$, '22023',
    'cron "* * * * 8": day-of-week 8 is out of range 0-7', 'day-of-week out of range');
SELECT throws_ok($$SELECT runrow._cron_parse('*/0 * * * *')$$, '22023',
    'cron "*/0 * * * *": the minute field has step "0", which must be a number from 1 to 60', 'step 0');
SELECT throws_ok($$SELECT runrow._cron_parse('5-1 * * * *')$$, '22023',
    'cron "5-1 * * * *": the minute field has range "5-1", which runs backwards (ranges do not wrap)',
    'a backwards range');
SELECT throws_ok($$SELECT runrow._cron_parse('1,,2 * * * *')$$, '22023',
    'cron "1,,2 * * * *": the minute field has an empty list item', 'an empty list item');
SELECT throws_ok($$SELECT runrow._cron_parse('x * * * *')$$, '22023',
    'cron "x * * * *": the minute field has "x" where a number is expected', 'not a number');
SELECT throws_ok($$SELECT runrow._cron_parse('0 0 * foo *')$$, '22023',
    'cron "0 0 * foo *": the month field has "foo" where a number or a name is expected', 'not a month name');
SELECT throws_ok($$SELECT runrow._cron_parse('@reboot')$$, '22023', NULL, 'an unknown macro');

-- The next tick: strictly after, whole minutes, UTC whatever the session's TimeZone.
SELECT is(pg_temp.nxt('* * * * *', '2024-01-01 00:00:30Z'), '2024-01-01 00:01Z', 'the next whole minute');
SELECT is(pg_temp.nxt('*/15 * * * *', '2024-01-01 00:15Z'), '2024-01-01 00:30Z', 'strictly after a tick');
SELECT is(pg_temp.nxt('5,35 1,13 * * *', '2024-01-01 13:35Z'), '2024-01-02 01:05Z', 'past the last tick of a day');
SELECT is(pg_temp.nxt('0 9 * * mon-fri', '2024-01-06 10:00Z'), '2024-01-08 09:00Z', 'Saturday to Monday 09:00');
SELECT is(pg_temp.nxt('0 0 1 1 *', '2024-06-01 00:00Z'), '2025-01-01 00:00Z', 'over the year''s end');
SELECT is(pg_temp.nxt('0 0 1 jan,jul *', '2024-02-01 00:00Z'), '2024-07-01 00:00Z', 'skips whole months');
SELECT is(pg_temp.nxt('0 0 31 * *', '2024-04-01 00:00Z'), '2024-05-31 00:00Z', 'skips months without a 31st');
SELECT is(pg_temp.nxt('0 0 29 2 *', '2024-03-01 00:00Z'), '2028-02-29 00:00Z', '29 February: the next leap year');
SELECT is(pg_temp.nxt('0 0 29 2 *', '2097-01-01 00:00Z'), '2104-02-29 00:00Z', '2100 is not a leap year');
SELECT is(pg_temp.nxt('0 0 30 2 *', '2024-01-01 00:00Z'), NULL, 'a cron that never fires has no next tick');
SELECT is(pg_temp.nxt('0 12 * * 7', '2024-01-01 00:00Z'), '2024-01-07 12:00Z', 'day-of-week 7: Sunday');
-- Vixie: both day fields restricted = either; one starting with * = both.
SELECT is(pg_temp.nxt('0 0 13 * fri', '2024-01-01 00:00Z'), '2024-01-05 00:00Z',
    'day-of-month 13 OR Friday: the first Friday');
SELECT is(pg_temp.nxt('0 0 */2 * mon', '2024-01-01 00:00Z'), '2024-01-15 00:00Z',
    '*/2 starts with *, so odd days AND Mondays: 15 January (the 8th is even)');
SET LOCAL TimeZone = 'America/New_York';
SELECT is(pg_temp.nxt('0 9 * * *', '2024-01-01 00:00Z'), '2024-01-01 09:00Z', 'UTC under another session TimeZone');
RESET TimeZone;

-- The previous tick: at or before, not before the floor.
SELECT is(pg_temp.prv('*/15 * * * *', '2024-01-01 00:20Z'), '2024-01-01 00:15Z', 'the last tick before');
SELECT is(pg_temp.prv('*/15 * * * *', '2024-01-01 00:15:59Z'), '2024-01-01 00:15Z', 'a tick counts at its minute');
SELECT is(pg_temp.prv('0 9 * * mon-fri', '2024-01-08 08:00Z'), '2024-01-05 09:00Z', 'Monday 08:00 back to Friday');
SELECT is(pg_temp.prv('0 0 29 2 *', '2027-01-01 00:00Z'), '2024-02-29 00:00Z', 'back to the last leap day');
SELECT is(pg_temp.prv('*/15 * * * *', '2024-01-01 00:20Z', '2024-01-01 00:16Z'), NULL, 'nothing after the floor');

-- Cross-check both walks against a scan of every minute of 3 days, from instants 7 minutes apart.
CREATE TEMP TABLE crons AS SELECT c AS cron, runrow._cron_parse(c) AS spec FROM unnest(ARRAY[
    '*/7 * * * *', '5,35 */5 * * *', '59 23 * * *', '0 0 * * 0', '0 12 1,2 * wed', '30 1-3 */2 * *'
]) AS c;
CREATE TEMP TABLE ticks AS
SELECT c.cron, m AS tick FROM crons AS c,
    generate_series('2024-02-27 00:00Z'::timestamptz, '2024-03-03 00:00Z', '1 minute') AS m
WHERE extract(MINUTE FROM m AT TIME ZONE 'UTC')::int = ANY ((c.spec).minutes)
  AND extract(HOUR FROM m AT TIME ZONE 'UTC')::int = ANY ((c.spec).hours)
  AND runrow._cron_day_matches(c.spec, m AT TIME ZONE 'UTC');
SELECT is_empty($$
    SELECT c.cron, t FROM crons AS c,
        generate_series('2024-02-28 00:00:30Z'::timestamptz, '2024-03-01 00:00Z', '7 minutes') AS t
    WHERE runrow._cron_next(c.spec, t) IS DISTINCT FROM
        (SELECT min(k.tick) FROM ticks AS k WHERE k.cron = c.cron AND k.tick > t)
$$, '_cron_next is the first matching minute after, over 29 February');
SELECT is_empty($$
    SELECT c.cron, t FROM crons AS c,
        generate_series('2024-02-28 00:00:30Z'::timestamptz, '2024-03-01 00:00Z', '7 minutes') AS t
    WHERE runrow._cron_prev(c.spec, t, '2024-02-27 00:00Z') IS DISTINCT FROM
        (SELECT max(k.tick) FROM ticks AS k WHERE k.cron = c.cron AND k.tick <= t)
$$, '_cron_prev is the last matching minute at or before');

SELECT * FROM finish();
ROLLBACK;
