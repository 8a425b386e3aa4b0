-- Recurring runs (issue 14, SPEC "Fleet scheduling"): a schedule is a cron expression (five
-- fields, UTC) and the template of the run each tick enqueues. Every worker's reaper pass
-- calls runrow.fire_schedules(); no singleton decides. A tick enqueues exactly once whoever
-- fires it, by two independent means: the firing transaction holds the schedule row's lock
-- (FOR UPDATE SKIP LOCKED, so reapers never queue behind each other) and advances
-- next_fire_at before it commits, and each tick's run carries an idempotency key derived from
-- the schedule id and the tick, so even a rewound next_fire_at replays the first run instead
-- of enqueueing a second one.
-- depends: 0013_fleet_run_columns

-- A parsed cron expression: the allowed values of each field, and whether day-of-month or
-- day-of-week was written starting with '*' (Vixie cron's rule: when both are restricted a
-- day matches either one; otherwise both must match).
CREATE TYPE runrow.cron_spec AS (
    minutes integer [],
    hours integer [],
    doms integer [],
    months integer [],
    dows integer [],
    dom_star boolean,
    dow_star boolean
);

CREATE TABLE runrow.schedule (
    id uuid NOT NULL DEFAULT gen_random_uuid(),
    name text NOT NULL,
    cron text NOT NULL,
    -- NULL: every tick opens a new conversation (its id derived from schedule and tick).
    conversation_id uuid,
    content jsonb NOT NULL,
    model text NOT NULL,
    user_id text,
    system_prompt text,
    tools jsonb NOT NULL DEFAULT '[]',
    metadata jsonb NOT NULL DEFAULT '{}',
    max_attempts integer NOT NULL DEFAULT 1,
    if_active text NOT NULL DEFAULT 'enqueue',
    priority integer NOT NULL DEFAULT 0,
    fairness_key text,
    concurrency_key text,
    catch_up text NOT NULL DEFAULT 'latest',
    max_catch_up integer NOT NULL DEFAULT 1,
    -- The oldest tick not fired yet. Always set: create_schedule refuses a cron that never fires.
    next_fire_at timestamptz NOT NULL,
    last_tick_at timestamptz,
    last_run_id uuid,
    last_error text,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT schedule_pkey PRIMARY KEY (id),
    CONSTRAINT schedule_name_key UNIQUE (name),
    CONSTRAINT schedule_name_check CHECK (length(name) BETWEEN 1 AND 200),
    CONSTRAINT schedule_catch_up_check CHECK (catch_up IN ('latest', 'each')),
    -- 'latest' is 'each' capped at one tick; the cap keeps one fire's work bounded.
    CONSTRAINT schedule_max_catch_up_check CHECK (
        max_catch_up BETWEEN 1 AND 1000 AND (catch_up = 'each' OR max_catch_up = 1)
    ),
    CONSTRAINT schedule_if_active_check CHECK (if_active IN ('enqueue', 'reject', 'interrupt')),
    CONSTRAINT schedule_max_attempts_check CHECK (max_attempts BETWEEN 1 AND 100),
    CONSTRAINT schedule_priority_check CHECK (priority BETWEEN -1000 AND 1000)
);

COMMENT ON TABLE runrow.schedule IS
'One row per recurring run: cron (five fields, UTC) and the template each tick enqueues. '
'next_fire_at is the oldest tick not fired yet; fire_schedules advances it in the transaction '
'that enqueues the tick. Written only by create_schedule, drop_schedule and fire_schedules.';

-- fire_schedules finds due rows by this index: its cost is the number of due schedules.
CREATE INDEX schedule_due ON runrow.schedule (next_fire_at);

CREATE VIEW runrow.schedules AS
SELECT
    s.name,
    s.cron,
    s.catch_up,
    s.max_catch_up,
    s.next_fire_at,
    s.last_tick_at,
    s.last_run_id,
    r.status AS last_run_status,
    s.last_error,
    s.conversation_id,
    s.model,
    s.user_id,
    s.max_attempts,
    s.if_active,
    s.priority,
    s.fairness_key,
    s.concurrency_key,
    s.created_at,
    s.id
FROM runrow.schedule AS s
LEFT JOIN runrow.agent_run AS r ON s.last_run_id = r.id;

COMMENT ON VIEW runrow.schedules IS
'One row per schedule, for DBAs and `runrow schedules list`: name, cron (UTC), catch-up '
'policy (latest: after an outage only the most recent missed tick runs; each: every missed '
'tick, at most max_catch_up of the most recent), next_fire_at (the next tick a reaper pass '
'will fire), last_tick_at, last_run_id and its status, last_error (why the last tick enqueued '
'nothing, for example the conversation has an active run and if_active = reject; NULL when it '
'enqueued), conversation_id (NULL: a new conversation per tick).';

REVOKE ALL ON runrow.schedule, runrow.schedules FROM PUBLIC;
GRANT SELECT ON runrow.schedule TO runrow_auditor;
GRANT SELECT ON runrow.schedules TO runrow_client, runrow_auditor;
