-- Private helpers of the schedules (create_schedule, fire_schedules): a cron parser and its
-- evaluation, in PL/pgSQL so the database clock is the only clock a tick is measured by.
-- Cron is the five-field Vixie syntax in UTC: minute hour day-of-month month day-of-week;
-- each field a list of *, N, N-M, */S, N-M/S or N/S (N to the field's maximum); month and
-- day-of-week also take names (jan..dec, sun..sat), day-of-week 7 is Sunday; the macros
-- @yearly @annually @monthly @weekly @daily @midnight @hourly.

-- One value of a field: a number or, where the field has names, a name.
CREATE OR REPLACE FUNCTION runrow._cron_value(
    token text, source text, what text, lo integer, hi integer, names text[]
)
RETURNS integer
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, runrow, pg_temp
AS $fn$
DECLARE
    v integer;
BEGIN
    IF _cron_value.token ~ '^[0-9]{1,2}$' THEN
        v := _cron_value.token::integer;
    ELSIF _cron_value.names IS NOT NULL AND _cron_value.token = ANY (_cron_value.names) THEN
        v := _cron_value.lo + array_position(_cron_value.names, _cron_value.token) - 1;
    ELSE
        RAISE EXCEPTION 'cron "%": the % field has "%" where a number% is expected',
            _cron_value.source, _cron_value.what, _cron_value.token,
            CASE WHEN _cron_value.names IS NULL THEN '' ELSE ' or a name' END
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF v < _cron_value.lo OR v > _cron_value.hi THEN
        RAISE EXCEPTION 'cron "%": % % is out of range %-%',
            _cron_value.source, _cron_value.what, v, _cron_value.lo, _cron_value.hi
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN v;
END
$fn$;

-- The sorted set of values one field allows.
CREATE OR REPLACE FUNCTION runrow._cron_field(
    field text, source text, what text, lo integer, hi integer, names text[] DEFAULT NULL
)
RETURNS integer[]
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, runrow, pg_temp
AS $fn$
DECLARE
    item text;
    parts text [];
    bounds text [];
    a integer;
    b integer;
    step integer;
    result integer [] := '{}';
BEGIN
    FOREACH item IN ARRAY string_to_array(_cron_field.field, ',') LOOP
        IF item = '' THEN
            RAISE EXCEPTION 'cron "%": the % field has an empty list item', _cron_field.source, _cron_field.what
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        parts := string_to_array(item, '/');
        step := 1;
        IF cardinality(parts) > 2 THEN
            RAISE EXCEPTION 'cron "%": the % field has "%", which has more than one /',
                _cron_field.source, _cron_field.what, item
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF cardinality(parts) = 2 THEN
            IF parts[2] !~ '^[0-9]{1,2}$' OR parts[2]::integer = 0 THEN
                RAISE EXCEPTION 'cron "%": the % field has step "%", which must be a number from 1 to %',
                    _cron_field.source, _cron_field.what, parts[2], _cron_field.hi - _cron_field.lo + 1
                    USING ERRCODE = 'invalid_parameter_value';
            END IF;
            step := parts[2]::integer;
        END IF;
        IF parts[1] = '*' THEN
            a := _cron_field.lo;
            b := _cron_field.hi;
        ELSIF position('-' IN parts[1]) > 0 THEN
            bounds := string_to_array(parts[1], '-');
            IF cardinality(bounds) <> 2 THEN
                RAISE EXCEPTION 'cron "%": the % field has range "%", which is not N-M',
                    _cron_field.source, _cron_field.what, parts[1]
                    USING ERRCODE = 'invalid_parameter_value';
            END IF;
            a := runrow._cron_value(bounds[1], _cron_field.source, _cron_field.what,
                _cron_field.lo, _cron_field.hi, _cron_field.names);
            b := runrow._cron_value(bounds[2], _cron_field.source, _cron_field.what,
                _cron_field.lo, _cron_field.hi, _cron_field.names);
            IF a > b THEN
                RAISE EXCEPTION 'cron "%": the % field has range "%", which runs backwards (ranges do not wrap)',
                    _cron_field.source, _cron_field.what, parts[1]
                    USING ERRCODE = 'invalid_parameter_value';
            END IF;
        ELSE
            a := runrow._cron_value(parts[1], _cron_field.source, _cron_field.what,
                _cron_field.lo, _cron_field.hi, _cron_field.names);
            -- N/S means N up to the field's maximum, every S.
            b := CASE WHEN cardinality(parts) = 2 THEN _cron_field.hi ELSE a END;
        END IF;
        result := result || ARRAY(SELECT generate_series(a, b, step));
    END LOOP;
    RETURN ARRAY(SELECT DISTINCT v FROM unnest(result) AS u (v) ORDER BY v);
END
$fn$;

CREATE OR REPLACE FUNCTION runrow._cron_parse(cron text)
RETURNS runrow.cron_spec
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, runrow, pg_temp
AS $fn$
DECLARE
    expr text;
    fields text [];
    spec runrow.cron_spec;
BEGIN
    PERFORM runrow._require_not_null(_cron_parse.cron, 'cron');
    IF length(_cron_parse.cron) > 200 THEN
        RAISE EXCEPTION 'cron must be at most 200 characters' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    expr := lower(btrim(_cron_parse.cron, E' \t\n\r'));
    expr := CASE expr
        WHEN '@yearly' THEN '0 0 1 1 *'
        WHEN '@annually' THEN '0 0 1 1 *'
        WHEN '@monthly' THEN '0 0 1 * *'
        WHEN '@weekly' THEN '0 0 * * 0'
        WHEN '@daily' THEN '0 0 * * *'
        WHEN '@midnight' THEN '0 0 * * *'
        WHEN '@hourly' THEN '0 * * * *'
        ELSE expr
    END;
    IF left(expr, 1) = '@' THEN
        RAISE EXCEPTION 'cron "%": unknown macro; use five fields or one of @yearly, @annually, '
            '@monthly, @weekly, @daily, @midnight, @hourly', _cron_parse.cron
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    fields := regexp_split_to_array(expr, '\s+');
    IF expr = '' OR cardinality(fields) <> 5 THEN
        RAISE EXCEPTION 'cron "%" must have five fields (minute hour day-of-month month day-of-week, UTC), got %',
            _cron_parse.cron, CASE WHEN expr = '' THEN 0 ELSE cardinality(fields) END
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'For example ''*/15 * * * *'' (every 15 minutes) or ''0 9 * * mon-fri'' (09:00 UTC on weekdays).';
    END IF;
    spec.minutes := runrow._cron_field(fields[1], _cron_parse.cron, 'minute', 0, 59);
    spec.hours := runrow._cron_field(fields[2], _cron_parse.cron, 'hour', 0, 23);
    spec.doms := runrow._cron_field(fields[3], _cron_parse.cron, 'day-of-month', 1, 31);
    spec.months := runrow._cron_field(fields[4], _cron_parse.cron, 'month', 1, 12,
        ARRAY['jan', 'feb', 'mar', 'apr', 'may', 'jun', 'jul', 'aug', 'sep', 'oct', 'nov', 'dec']);
    -- 7 is Sunday as well as 0 (as in Vixie cron), so 5-7 means Friday to Sunday.
    spec.dows := ARRAY(
        SELECT DISTINCT v % 7 FROM unnest(runrow._cron_field(fields[5], _cron_parse.cron, 'day-of-week', 0, 7,
            ARRAY['sun', 'mon', 'tue', 'wed', 'thu', 'fri', 'sat'])) AS u (v)
        ORDER BY v % 7);
    -- Vixie cron's rule: a field written starting with '*' (even */2) does not restrict the
    -- day on its own, and the two day fields are ANDed; when both are restricted, either
    -- one matching is enough ('0 0 1 * mon' is the 1st and every Monday).
    spec.dom_star := left(fields[3], 1) = '*';
    spec.dow_star := left(fields[5], 1) = '*';
    RETURN spec;
END
$fn$;

-- Whether the day of `t` (a UTC timestamp) is one the spec fires on (month and day fields).
CREATE OR REPLACE FUNCTION runrow._cron_day_matches(spec runrow.cron_spec, t timestamp)
RETURNS boolean
LANGUAGE sql
IMMUTABLE
SET search_path = pg_catalog, runrow, pg_temp
AS $fn$
    SELECT extract(MONTH FROM t)::integer = ANY (spec.months)
        AND CASE
            WHEN spec.dom_star OR spec.dow_star
                THEN extract(DAY FROM t)::integer = ANY (spec.doms)
                AND extract(DOW FROM t)::integer = ANY (spec.dows)
            ELSE extract(DAY FROM t)::integer = ANY (spec.doms)
                OR extract(DOW FROM t)::integer = ANY (spec.dows)
        END;
$fn$;

-- The first tick strictly after `after`, or NULL when there is none within ten years (a
-- cron such as '0 0 30 2 *' never fires; the longest real gap, 29 February across 2100, is
-- eight years). Walks by whole months, days and hours, so it costs a few dozen steps.
CREATE OR REPLACE FUNCTION runrow._cron_next(spec runrow.cron_spec, after timestamptz)
RETURNS timestamptz
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, runrow, pg_temp
AS $fn$
DECLARE
    t timestamp := date_trunc('minute', _cron_next.after AT TIME ZONE 'UTC') + interval '1 minute';
    horizon timestamp := t + interval '10 years';
    n integer;
BEGIN
    LOOP
        IF t > horizon THEN
            RETURN NULL;
        END IF;
        IF NOT extract(MONTH FROM t)::integer = ANY (spec.months) THEN
            t := date_trunc('month', t) + interval '1 month';
            CONTINUE;
        END IF;
        IF NOT runrow._cron_day_matches(spec, t) THEN
            t := date_trunc('day', t) + interval '1 day';
            CONTINUE;
        END IF;
        SELECT min(h) INTO n FROM unnest(spec.hours) AS u (h) WHERE h >= extract(HOUR FROM t);
        IF n IS NULL THEN
            t := date_trunc('day', t) + interval '1 day';
            CONTINUE;
        END IF;
        IF n > extract(HOUR FROM t) THEN
            t := date_trunc('day', t) + make_interval(hours => n);
        END IF;
        SELECT min(m) INTO n FROM unnest(spec.minutes) AS u (m) WHERE m >= extract(MINUTE FROM t);
        IF n IS NULL THEN
            t := date_trunc('hour', t) + interval '1 hour';
            CONTINUE;
        END IF;
        RETURN (date_trunc('hour', t) + make_interval(mins => n)) AT TIME ZONE 'UTC';
    END LOOP;
END
$fn$;

-- The last tick at or before `at` and not before `not_before`, or NULL. The mirror image of
-- _cron_next: catch-up walks back from now over the missed ticks, newest first, so it costs
-- what it enqueues, not the length of the outage.
CREATE OR REPLACE FUNCTION runrow._cron_prev(spec runrow.cron_spec, at timestamptz, not_before timestamptz)
RETURNS timestamptz
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, runrow, pg_temp
AS $fn$
DECLARE
    t timestamp := date_trunc('minute', _cron_prev.at AT TIME ZONE 'UTC');
    floor_at timestamp := coalesce(_cron_prev.not_before AT TIME ZONE 'UTC', t - interval '10 years');
    n integer;
BEGIN
    LOOP
        IF t < floor_at THEN
            RETURN NULL;
        END IF;
        IF NOT extract(MONTH FROM t)::integer = ANY (spec.months) THEN
            t := date_trunc('month', t) - interval '1 minute';
            CONTINUE;
        END IF;
        IF NOT runrow._cron_day_matches(spec, t) THEN
            t := date_trunc('day', t) - interval '1 minute';
            CONTINUE;
        END IF;
        SELECT max(h) INTO n FROM unnest(spec.hours) AS u (h) WHERE h <= extract(HOUR FROM t);
        IF n IS NULL THEN
            t := date_trunc('day', t) - interval '1 minute';
            CONTINUE;
        END IF;
        IF n < extract(HOUR FROM t) THEN
            t := date_trunc('day', t) + make_interval(hours => n, mins => 59);
        END IF;
        SELECT max(m) INTO n FROM unnest(spec.minutes) AS u (m) WHERE m <= extract(MINUTE FROM t);
        IF n IS NULL THEN
            t := date_trunc('hour', t) - interval '1 minute';
            CONTINUE;
        END IF;
        t := date_trunc('hour', t) + make_interval(mins => n);
        RETURN CASE WHEN t < floor_at THEN NULL ELSE t AT TIME ZONE 'UTC' END;
    END LOOP;
END
$fn$;

-- The idempotency key of one tick of one schedule: the second guarantee of exactly once
-- (after the schedule row's lock), and how a DBA finds the run of a tick in agent_run.
CREATE OR REPLACE FUNCTION runrow._schedule_tick_key(schedule_id uuid, tick timestamptz)
RETURNS text
LANGUAGE sql
STABLE
SET search_path = pg_catalog, runrow, pg_temp
AS $fn$
    SELECT 'runrow-schedule:' || schedule_id::text || ':'
        || to_char(tick AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI"Z"');
$fn$;

-- The conversation of a tick of a schedule that opens a new one per tick. Derived, not
-- random: enqueue_run's idempotency fingerprint includes the conversation, so a replayed
-- tick must name the same one to be recognised as the same request.
CREATE OR REPLACE FUNCTION runrow._schedule_conversation(schedule_id uuid, tick timestamptz)
RETURNS uuid
LANGUAGE sql
STABLE
SET search_path = pg_catalog, runrow, pg_temp
AS $fn$
    SELECT md5(runrow._schedule_tick_key(schedule_id, tick))::uuid;
$fn$;

-- A schedule whose cron does not parse (written around create_schedule before migration 0067's
-- trigger) is stopped, by the firing pass and by _rewind_schedules alike: not due again, and
-- last_error says why. No SET clause: it runs under its callers' pinned search_path.
CREATE OR REPLACE FUNCTION runrow._stop_schedule_unparsed(schedule_id uuid, message text, state text)
RETURNS void
LANGUAGE plpgsql
AS $fn$
BEGIN
    UPDATE runrow.schedule AS x SET
        next_fire_at = 'infinity',
        passed_over_at = NULL,
        last_error = format('cron does not parse, so the schedule stopped: %s (SQLSTATE %s); drop it '
            'and create it again', _stop_schedule_unparsed.message, _stop_schedule_unparsed.state),
        updated_at = now()
    WHERE x.id = _stop_schedule_unparsed.schedule_id;
END
$fn$;

-- Schedules whose next tick was computed by a clock ahead of `at`: the database clock ran ahead
-- (a wrong NTP step, a VM restored from a snapshot taken later) and was set back. A pass then
-- moved next_fire_at to the first tick after that future instant, and the schedule stayed silent
-- for as long as the clock had been ahead, with no last_error (a passed_over_at stamped then kept
-- a busy one out of the firing order as long). Every writer of a schedule stamps updated_at with
-- now(), so a row written by the clock that ran ahead has updated_at > now() once it is set
-- back: an index range (schedule_updated_at, migration 0103) that is empty but for then. The
-- bound is the real clock (clock_timestamp()) when later than `at`: a row another pass wrote
-- after this transaction began is later than its now(), never than the real clock. Such a
-- row whose next_fire_at is later than the first tick after `at` is moved back to that tick, and
-- last_error says so (runrow_schedules_with_last_error counts it until its next tick fires); a
-- tick fired while the clock was ahead is a replay when the clock reaches it again (its key).
-- Each row is written once (updated_at = now()), under its row lock, skipping rows a pass holds.
-- A stopped schedule is not read; a cron that does not parse stops its schedule here as in the
-- firing pass: max_schedules counts rows written, so no row read is left to be read again.
-- No SET clause: it runs under _fire_schedules_pass's pinned search_path.
CREATE OR REPLACE FUNCTION runrow._rewind_schedules(at timestamptz, max_schedules integer)
RETURNS integer
LANGUAGE plpgsql
AS $fn$
DECLARE
    -- Written ahead means later than the real clock, not only than `at` (the caller's now(), its
    -- transaction's start): a pass that began after this one and committed before its candidates
    -- were read stamped a later now(), and its row was taken for one written by a clock that ran
    -- ahead, its tick moved back (replayed) with last_error blaming the clock (the SQL review of
    -- 0103). A committed now() is never later than clock_timestamp() read after the commit: read
    -- once for the candidates (a bound lower than the re-read's, so none is missed) and again as
    -- each row is locked, after the commit of the version locked.
    written_after constant timestamptz := greatest(_rewind_schedules.at, clock_timestamp());
    candidate uuid;
    s runrow.schedule;
    first_tick timestamptz;
    rewound integer := 0;
BEGIN
    -- Every row the LIMIT reads is written below (or taken by another pass): a row read and
    -- left as it was stays the earliest written ahead, and max_schedules of those took every
    -- pass's budget, so a live schedule behind them was never moved back (the SQL review of
    -- 0103). A stopped schedule has no tick to move back, so it is not read at all.
    FOR candidate IN
        SELECT x.id FROM runrow.schedule AS x
        WHERE x.updated_at > written_after AND x.next_fire_at <> 'infinity'
        ORDER BY x.updated_at
        LIMIT _rewind_schedules.max_schedules
    LOOP
        SELECT * INTO s FROM runrow.schedule AS x
        WHERE
            x.id = candidate AND x.next_fire_at <> 'infinity'
            AND x.updated_at > greatest(_rewind_schedules.at, clock_timestamp())
        FOR UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        BEGIN
            first_tick := runrow._cron_next(runrow._cron_parse(s.cron), _rewind_schedules.at);
        EXCEPTION WHEN data_exception THEN
            -- Stopped as the firing pass stops it: its next tick cannot be counted either way.
            PERFORM runrow._stop_schedule_unparsed(s.id, SQLERRM, SQLSTATE);
            rewound := rewound + 1;
            CONTINUE;
        END;
        UPDATE runrow.schedule AS x SET
            next_fire_at = least(x.next_fire_at, first_tick),
            passed_over_at = CASE WHEN x.passed_over_at <= _rewind_schedules.at THEN x.passed_over_at END,
            last_error = CASE
                WHEN x.next_fire_at > first_tick OR x.passed_over_at > _rewind_schedules.at THEN format(
                    'the database clock was set back: this schedule was written at %s, %s ahead of %s, '
                    'and its next tick %s was counted from then; moved back to %s, the first tick after now',
                    to_char(x.updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
                    x.updated_at - _rewind_schedules.at,
                    to_char(_rewind_schedules.at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
                    to_char(x.next_fire_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI"Z"'),
                    to_char(least(x.next_fire_at, first_tick) AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI"Z"'))
                ELSE x.last_error
            END,
            updated_at = now()
        WHERE x.id = s.id;
        rewound := rewound + 1;
    END LOOP;
    RETURN rewound;
END
$fn$;

-- fire_schedules_pass with the clock as an argument, so tests can stand at any instant; the
-- public functions pass now(). Each due schedule is taken under its row lock, skipping
-- rows another pass holds; its missed ticks are enqueued by the catch-up policy and
-- next_fire_at moves past `at` in the same transaction. A tick whose enqueue fails on the
-- template (the conversation belongs to another user, an active run with if_active = reject)
-- is recorded in last_error and not retried: the same template would fail the same way.
--
-- A pass never waits on another session, so passes cannot deadlock and one busy schedule holds
-- no other (issue 11's schedule audit found all three):
-- - the rows are taken one at a time: a FOR loop over the query fetched, and so locked, ten at
--   once, and while the pass waited on the first the other nine were skipped by every pass;
-- - a tick's conversation is locked only if it is free (a client enqueueing into it, another
--   pass): otherwise the schedule is left due, untouched, for a later pass;
-- - a stop that times out on a run's lock (if_active = interrupt, 55P03) leaves it due too; it
--   is in the class of 55000 that marks a template as failing for good, so it is caught first;
-- - the prompt a tick pins is pinned when the schedule is created (create_schedule), so no two
--   passes insert the same new prompt row and wait on each other's.
-- A cron that does not parse (written around create_schedule before migration 0067's trigger)
-- stops its own schedule (next_fire_at infinity, last_error says why), not every pass.
--
-- Busy schedules take no other's turn (migration 0079): max_schedules counts the schedules the
-- pass moves on, not the ones it leaves due, and a schedule left due is stamped passed_over_at
-- = at, which puts it behind every schedule due at `at` in the firing order
-- greatest(next_fire_at, passed_over_at). Counted the old way, 100 busy schedules took every
-- pass's whole budget, the same ones first each time, and no other schedule fired. The pass
-- reads at most 10 x max_schedules due rows (in one index scan, unlocked; each is then locked
-- by id), so thousands of busy schedules cost each pass that many rows, never all of them.
--
-- A call commits at most 64 subtransactions that write (PGPROC_MAX_CACHED_SUBXIDS): each tick's
-- enqueue is one (its BEGIN ... EXCEPTION block), two with if_active = interrupt (the stop in
-- enqueue_run opens a block of its own). A 65th in one transaction overflows the backend's subxid
-- cache, and until it ends every snapshot in the cluster is marked overflowed: each check of a
-- row written since it began looks the xid up in pg_subtrans, here and on replicas. A pass of
-- 100 due schedules committed 100 (measured: 10 scans of 2,000 such rows did 20,000 pg_subtrans
-- page reads while it was open, 0 at 64). A block that raised counts nothing: its xids leave the
-- cache as it rolls back; the cron's block writes nothing, so it has no xid. The call stops
-- before the tick that would pass 64; a schedule stopped between its missed ticks keeps the
-- first one not tried as next_fire_at (the oldest tick not fired), so the next call resumes it.
--
-- It reports the schedules it moved on as well as the runs it created (migration 0100): a pass
-- that moved on max_schedules schedules whose ticks enqueued nothing (if_active = reject on a
-- conversation with an active run, a template that fails) created 0 runs, and the reaper, which
-- stopped at a pass of 0, left the due schedules behind them for its next interval, one interval
-- per 100 such schedules.
CREATE OR REPLACE FUNCTION runrow._fire_schedules_pass(
    at timestamptz, max_schedules integer, OUT enqueued integer, OUT moved_on integer
)
LANGUAGE plpgsql
SET search_path = pg_catalog, runrow, pg_temp
AS $fn$
DECLARE
    -- PGPROC_MAX_CACHED_SUBXIDS: the subtransactions with an xid a backend's cache holds.
    max_subxacts constant integer := 64;
    subxacts integer := 0;
    cost integer;
    cut timestamptz;
    tried timestamptz;
    candidates uuid [];
    candidate uuid;
    s runrow.schedule;
    spec runrow.cron_spec;
    ticks timestamptz [];
    tick timestamptz;
    t timestamptz;
    conv uuid;
    enq record;
    fired integer := 0;
    err text;
    busy text;
    last_run uuid;
BEGIN
    -- Schedules counted from a clock that has since been set back come first: they are not due,
    -- and would stay silent for as long as the clock was ahead.
    moved_on := runrow._rewind_schedules(_fire_schedules_pass.at, _fire_schedules_pass.max_schedules);
    -- A list, not a cursor: each row is locked by id below, and a row this pass leaves due
    -- (stamped, so later in the order) is not met again.
    candidates := ARRAY(
        SELECT x.id FROM runrow.schedule AS x
        WHERE greatest(x.next_fire_at, x.passed_over_at) <= _fire_schedules_pass.at
        ORDER BY greatest(x.next_fire_at, x.passed_over_at), x.next_fire_at
        LIMIT 10 * _fire_schedules_pass.max_schedules
    );
    FOREACH candidate IN ARRAY candidates LOOP
        EXIT WHEN moved_on >= _fire_schedules_pass.max_schedules OR subxacts >= max_subxacts;
        -- Still due (another pass may have fired it since the list was read), and not another
        -- pass's: the row lock is the first guarantee of exactly once.
        SELECT * INTO s FROM runrow.schedule AS x
        WHERE x.id = candidate AND x.next_fire_at <= _fire_schedules_pass.at
        FOR UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        BEGIN
            spec := runrow._cron_parse(s.cron);
        EXCEPTION WHEN data_exception THEN
            PERFORM runrow._stop_schedule_unparsed(s.id, SQLERRM, SQLSTATE);
            moved_on := moved_on + 1;
            CONTINUE;
        END;
        -- The missed ticks, at most max_catch_up of the most recent (1 for 'latest').
        ticks := '{}';
        t := _fire_schedules_pass.at;
        WHILE cardinality(ticks) < s.max_catch_up LOOP
            t := runrow._cron_prev(spec, t, s.next_fire_at);
            EXIT WHEN t IS NULL;
            ticks := t || ticks;
            t := t - interval '1 minute';
        END LOOP;
        err := NULL;
        busy := NULL;
        last_run := NULL;
        cut := NULL;
        tried := NULL;
        cost := CASE WHEN s.if_active = 'interrupt' THEN 2 ELSE 1 END;
        FOREACH tick IN ARRAY ticks LOOP
            IF subxacts + cost > max_subxacts THEN
                cut := tick;
                EXIT;
            END IF;
            conv := coalesce(s.conversation_id, runrow._schedule_conversation(s.id, tick));
            IF NOT runrow._try_lock_conversation(conv) THEN
                busy := format('conversation %s is busy (another session holds it)', conv);
                EXIT;
            END IF;
            BEGIN
                SELECT * INTO enq FROM runrow.enqueue_run(
                    conversation_id => conv,
                    content => s.content,
                    model => s.model,
                    user_id => s.user_id,
                    system_prompt => s.system_prompt,
                    tools => s.tools,
                    max_attempts => s.max_attempts,
                    idempotency_key => runrow._schedule_tick_key(s.id, tick),
                    if_active => s.if_active,
                    metadata => s.metadata,
                    priority => s.priority,
                    fairness_key => s.fairness_key,
                    concurrency_key => s.concurrency_key
                );
                last_run := enq.run_id;
                err := NULL;
                IF enq.created THEN
                    fired := fired + 1;
                END IF;
                subxacts := subxacts + cost;
            EXCEPTION
                WHEN lock_not_available THEN
                    busy := SQLERRM;
                    EXIT;
                WHEN data_exception OR integrity_constraint_violation OR insufficient_privilege
                    OR object_not_in_prerequisite_state THEN
                    err := format('tick %s enqueued nothing: %s (SQLSTATE %s)',
                        to_char(tick AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI"Z"'), SQLERRM, SQLSTATE);
            END;
            tried := tick;
        END LOOP;
        IF busy IS NOT NULL THEN
            -- Left due, behind the others: the ticks enqueued before this one are replays next
            -- time (their keys).
            UPDATE runrow.schedule AS x SET
                passed_over_at = _fire_schedules_pass.at,
                last_error = format('tick %s waits for a later pass: %s',
                    to_char(tick AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI"Z"'), busy),
                updated_at = now()
            WHERE x.id = s.id;
            CONTINUE;
        END IF;
        -- Not one tick fitted: left as it is, for the next call.
        EXIT WHEN cut = ticks[1];
        UPDATE runrow.schedule AS x SET
            next_fire_at = coalesce(cut, runrow._cron_next(spec, _fire_schedules_pass.at)),
            passed_over_at = NULL,
            last_tick_at = coalesce(tried, x.last_tick_at),
            last_run_id = coalesce(last_run, x.last_run_id),
            last_error = err,
            updated_at = now()
        WHERE x.id = s.id;
        moved_on := moved_on + 1;
    END LOOP;
    enqueued := fired;
END
$fn$;

-- The runs a pass created, as fire_schedules returns it (and pgTAP calls it at chosen instants).
CREATE OR REPLACE FUNCTION runrow._fire_schedules(at timestamptz, max_schedules integer)
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, runrow, pg_temp
AS $fn$
BEGIN
    RETURN (
        SELECT p.enqueued FROM runrow._fire_schedules_pass(_fire_schedules.at, _fire_schedules.max_schedules) AS p
    );
END
$fn$;

REVOKE ALL ON FUNCTION runrow._cron_value(text, text, text, integer, integer, text[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION runrow._cron_field(text, text, text, integer, integer, text[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION runrow._cron_parse(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION runrow._cron_day_matches(runrow.cron_spec, timestamp) FROM PUBLIC;
REVOKE ALL ON FUNCTION runrow._cron_next(runrow.cron_spec, timestamptz) FROM PUBLIC;
REVOKE ALL ON FUNCTION runrow._cron_prev(runrow.cron_spec, timestamptz, timestamptz) FROM PUBLIC;
REVOKE ALL ON FUNCTION runrow._schedule_tick_key(uuid, timestamptz) FROM PUBLIC;
REVOKE ALL ON FUNCTION runrow._schedule_conversation(uuid, timestamptz) FROM PUBLIC;
REVOKE ALL ON FUNCTION runrow._stop_schedule_unparsed(uuid, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION runrow._rewind_schedules(timestamptz, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION runrow._fire_schedules_pass(timestamptz, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION runrow._fire_schedules(timestamptz, integer) FROM PUBLIC;

COMMENT ON FUNCTION runrow._cron_value(text, text, text, integer, integer, text[]) IS
'Private. One value of a cron field (a number, or a name where names are given, counted from lo); '
'22023 naming cron when it is neither or out of lo..hi.';
COMMENT ON FUNCTION runrow._cron_field(text, text, text, integer, integer, text[]) IS
'Private. The sorted values one cron field allows: a comma list of *, N, N-M, */S, N-M/S, N/S '
'(N to hi). 22023 naming cron for an empty item, a bad step, a backwards range or a bad value.';
COMMENT ON FUNCTION runrow._cron_parse(text) IS
'Private. Parses a five-field cron expression (UTC; minute hour day-of-month month day-of-week; '
'names jan..dec and sun..sat; 7 = Sunday; @yearly @annually @monthly @weekly @daily @midnight '
'@hourly) into a cron_spec, with dom_star/dow_star for Vixie''s day rule. 22004/22023 naming cron.';
COMMENT ON FUNCTION runrow._cron_day_matches(runrow.cron_spec, timestamp) IS
'Private. Whether a UTC day is a firing day: the month matches, and day-of-month AND day-of-week '
'match when either field starts with *, else day-of-month OR day-of-week (Vixie cron).';
COMMENT ON FUNCTION runrow._cron_next(runrow.cron_spec, timestamptz) IS
'Private. The first tick (a whole UTC minute the spec matches) strictly after `after`; NULL '
'when there is none within ten years.';
COMMENT ON FUNCTION runrow._cron_prev(runrow.cron_spec, timestamptz, timestamptz) IS
'Private. The last tick at or before `at` and not before `not_before` (NULL: ten years back); '
'NULL when there is none.';
COMMENT ON FUNCTION runrow._schedule_tick_key(uuid, timestamptz) IS
'Private. The enqueue_run idempotency key of one tick of one schedule: '
'runrow-schedule:<schedule id>:<tick as YYYY-MM-DDTHH:MIZ>.';
COMMENT ON FUNCTION runrow._schedule_conversation(uuid, timestamptz) IS
'Private. The conversation id of one tick of a schedule without a fixed conversation: derived '
'from the tick key, so a replayed tick names the same conversation.';
COMMENT ON FUNCTION runrow._fire_schedules(timestamptz, integer) IS
'Private; fire_schedules calls it with now(). _fire_schedules_pass at `at`, returning only the '
'number of runs created.';
COMMENT ON FUNCTION runrow._stop_schedule_unparsed(uuid, text, text) IS
'Private; _fire_schedules_pass and _rewind_schedules call it for a schedule whose cron does not '
'parse: next_fire_at infinity, passed_over_at cleared, last_error "cron does not parse, so the '
'schedule stopped: <message> (SQLSTATE <state>); drop it and create it again", updated_at now().';
COMMENT ON FUNCTION runrow._rewind_schedules(timestamptz, integer) IS
'Private; _fire_schedules_pass calls it first. Up to max_schedules schedules written by a clock '
'ahead of `at` and of the real clock (updated_at > greatest(at, clock_timestamp()): the database '
'clock was set back since; a row another transaction wrote after this one began is not), each '
'under its row lock '
'taken FOR UPDATE SKIP LOCKED: next_fire_at becomes the first tick after `at` when it was later '
'(counted from the future instant), a passed_over_at after `at` is cleared, last_error says '
'what was moved back, and updated_at becomes now(), so a row is taken once. A stopped schedule '
'(next_fire_at infinity) is not read; one whose cron does not parse is stopped as the firing pass '
'stops it (next_fire_at infinity, last_error says why). Returns the schedules it wrote.';
COMMENT ON FUNCTION runrow._fire_schedules_pass(timestamptz, integer) IS
'Private; fire_schedules_pass calls it with now(), _fire_schedules wraps it. Fires up to max_schedules schedules due at `at` '
'(next_fire_at <= at), in the order of greatest(next_fire_at, passed_over_at), each under its '
'row lock taken FOR UPDATE SKIP LOCKED: enqueues its missed ticks (the newest max_catch_up of '
'them; 1 for catch_up latest) with enqueue_run and the tick''s idempotency key, records '
'last_tick_at, last_run_id and last_error (a tick whose enqueue raised 22xxx, 23xxx, 42501 or '
'55000 is not retried), and moves next_fire_at to the first tick after `at`, in the caller''s '
'transaction. Never waits: rows are taken one at a time, and a schedule whose tick finds its '
'conversation locked by another session, or whose stop times out (55P03), is left due for a '
'later pass with last_error saying so and passed_over_at = at (behind every schedule due at '
'`at`); such a schedule does not count toward max_schedules. Reads at most 10 x max_schedules '
'due schedules, and commits at most 64 subtransactions that write (a tick''s enqueue is one, two '
'with if_active = interrupt), so the backend''s subxid cache never overflows: it stops before '
'the tick that would pass 64, and a schedule stopped between its missed ticks keeps the first '
'one not tried as next_fire_at. A cron that does not parse stops its schedule (next_fire_at '
'infinity). First, _rewind_schedules moves back the next tick of schedules written by a clock '
'ahead of `at` (the database clock set back), up to max_schedules of them. Returns enqueued, the '
'number of runs created, and moved_on, the schedules it moved on (fired, their ticks skipped for '
'good, stopped, or moved back by _rewind_schedules); a pass that moved on max_schedules may '
'have left more due.';
