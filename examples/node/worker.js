// A runrow worker in Node.js: the same queue as the Python worker, through the runrow.* SQL API only.
// Handler: echo (streams metadata.echo back over metadata.duration seconds), like pyworker's echo, for runs
// of ECHO_MODEL only: a run of another model is handed back, its attempt given back (README.md beside this).
// Env: DATABASE_URL, CONCURRENCY (2), LEASE_SECONDS (30), POLL_SECONDS (5), GRACE_SECONDS (30),
// DRAIN_SECONDS (30), WORKER_ID (node-<host>-<pid>), ECHO_MODEL (echo). What every worker must do: README.md.
'use strict';
const os = require('os');
const { Client, Pool } = require('pg');

// Every setting checked before anything starts, exit 2 naming it: LEASE_SECONDS=abc was NaN, so every claim
// failed ("invalid input syntax for type integer") and setTimeout(reap, NaN) ran the reaper every 1 ms;
// CONCURRENCY=0 claimed nothing and said nothing.
const usage = (name, what, value) => {
  console.error(`worker.js: ${name} must be ${what}, got ${JSON.stringify(value)}`);
  process.exit(2);
};
function setting(name, fallback, { min, max, whole }) {
  const raw = process.env[name] ?? String(fallback);
  const value = Number(raw);
  const what = `${whole ? 'a whole number' : 'a number'} from ${min} to ${max}`;
  if (!(whole ? /^\d+$/ : /^\d+(\.\d+)?$/).test(raw) || value < min || value > max) usage(name, what, raw);
  return value;
}
function text(name, fallback) {
  const value = process.env[name] ?? fallback;
  if (value.length < 1 || value.length > 200 || /\p{C}/u.test(value)) {
    usage(name, '1 to 200 printable characters', value);
  }
  return value;
}
const url = process.env.DATABASE_URL;
if (!url) usage('DATABASE_URL', 'set (postgresql://user@host/db)', url ?? null);
const concurrency = setting('CONCURRENCY', 2, { min: 1, max: 1000, whole: true }); // claim_runs' max_runs
const lease = setting('LEASE_SECONDS', 30, { min: 1, max: 3600, whole: true }); // claim_runs' lease_seconds
const poll = setting('POLL_SECONDS', 5, { min: 0.01, max: 3600 });
const grace = setting('GRACE_SECONDS', 30, { min: 0, max: 86400, whole: true }); // reap_expired_runs'
const drainSeconds = setting('DRAIN_SECONDS', 30, { min: 0, max: 86400 });
const workerId = text('WORKER_ID', `node-${os.hostname()}-${process.pid}`);
const echoModel = text('ECHO_MODEL', 'echo');
const pool = new Pool({ connectionString: url, max: concurrency + 2, application_name: workerId });
// An idle pooled connection whose session ends (restart, failover, pg_terminate_backend) emits 'error' on
// the pool, and an 'error' event nobody listens to kills Node. The pool drops it and connects afresh.
pool.on('error', (err) => log('idle connection lost:', err.message));
const running = new Map(); // run_id -> run (with .stop(why)): a stop, the heartbeat or the drain end it early
const timers = {};
let stopping = false;
let claiming = null;
let listener = null;
let exitCode = 0;
let listenWait = 250; // the LISTEN connection's reconnect backoff: doubles to 10 s, back to 250 ms once it is up
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const log = (...args) => console.log(new Date().toISOString(), workerId, ...args);

// "The database went away", not "this run is wrong": a lost connection (class 08, or no SQLSTATE), the
// server ending the session (57P01-03), too many connections, a read-only node after a failover, a
// serialization failure or deadlock. The call is made again; such an error never ends or releases a run.
function transient(err) {
  const code = String(err.code ?? '');
  if (/^(08|57P0|53300|25006|40001|40P01)/.test(code) || /^E[A-Z]+$/.test(code)) return true;
  return code === '' && /connection|terminated|timeout|not queryable/i.test(String(err.message));
}

// The database refusing the run's own data (class 22, NOT NULL and CHECK violations, program limits):
// every attempt would fail the same way, so the run ends `failed` at once rather than paying for retries.
const deterministic = (err) => /^(22|54)/.test(String(err.code ?? '')) || ['23502', '23514'].includes(err.code);

// One runrow.* call, made again on a fresh connection after a transient error (capped backoff) for up to a
// lease; the claim token's fence then decides whether the run is still ours. `readBack` asks, before a
// retry, whether a write whose answer was lost landed after all (then its rows are the answer).
async function call(sql, params, readBack = null) {
  const deadline = Date.now() + lease * 1000;
  for (let tries = 0; ; tries++) {
    try {
      const found = tries > 0 && readBack ? await readBack() : null;
      return found ?? (await pool.query(sql, params)).rows;
    } catch (err) {
      if (!transient(err) || Date.now() > deadline) throw err;
      log('database call failed, trying again:', err.message);
      await sleep(Math.min(100 * 2 ** tries, 2000));
    }
  }
}

const READ = 'SELECT seq, type FROM runrow.read_events(run_id => $1, after_seq => $2, max_events => 10000)';

// Journal events: the last seq, or null when fenced out (stand down, write nothing more).
async function append(run, events) {
  const [{ seq }] = await call(
    'SELECT runrow.append_events(run_id => $1, claim_token => $2, events => $3::jsonb) AS seq',
    [run.run_id, run.claim_token, JSON.stringify(events)], () => landed(run));
  if (seq !== null) run.seq = Number(seq);
  return seq;
}

// Did an append whose answer was lost commit? Only the claim token's holder writes events other than the
// SQL functions' own, so such an event after our last known seq (and this attempt's run_claimed) is ours.
const SQL_WRITTEN = /^(complete|run_.*|user_message_created|cancel_requested|approval_.*|tool_interrupted|budget_.*)$/;
async function landed(run) {
  let [ours, last] = [run.seq > 0, null];
  for (const e of (await pool.query(READ, [run.run_id, run.seq])).rows) {
    if (e.type === 'run_claimed') [ours, last] = [true, null];
    else if (ours && !SQL_WRITTEN.test(e.type)) last = e.seq;
  }
  return last === null ? null : [{ seq: last }];
}

// A retried attempt starts the echo over, so what earlier attempts streamed is not the answer: journal
// `superseded` first (README, "The journal's events"; pyworker/worker/supersede.py). Echo keeps no work, so
// A is the run's first run_claimed, B the seq before this attempt's. Undefined: nothing to take back.
async function supersede(run) {
  if (run.attempt <= 1) return undefined;
  const [claims, deltas] = [[], []];
  for (let after = 0; ;) {
    const page = await call(READ, [run.run_id, after]);
    for (const e of page) {
      if (e.type === 'run_claimed') claims.push(Number(e.seq));
      else if (/^(text|thinking|input_json)_delta$/.test(e.type)) deltas.push(Number(e.seq));
    }
    if (page.length < 10000) break; // read_events' page limit
    after = Number(page.at(-1).seq);
  }
  const [from, through] = [claims[0], claims.at(-1) - 1];
  if (claims.length < 2 || !deltas.some((seq) => seq > from && seq <= through)) return undefined;
  return append(run, [{ type: 'superseded', after_seq: from, through_seq: through, attempt: run.attempt }]);
}

// The handler: metadata.echo back over metadata.duration seconds, sliced by code points (a slice by UTF-16
// units splits an emoji's surrogate pair, and jsonb refuses the lone half: 22P02). metadata.fail throws.
async function echo(run, pause) {
  const meta = run.metadata || {};
  const chars = Array.from(String(meta.echo ?? 'echo'));
  const duration = Number(meta.duration ?? 0.5);
  const steps = Math.max(1, Math.floor(duration / 0.05));
  let sent = '';
  for (let i = 0; i < steps && !run.stopped; i++) {
    const piece = chars.slice(Math.floor((i * chars.length) / steps), Math.floor(((i + 1) * chars.length) / steps));
    if (piece.length && (await append(run, [{ type: 'text_delta', index: 0, text: piece.join('') }])) === null) {
      return run.stop('lost');
    }
    sent += piece.join('');
    await pause((duration * 1000) / steps);
  }
  if (meta.fail && !run.stopped) throw new Error('echo: failing on purpose (metadata.fail)');
  return sent;
}

async function execute(run) {
  let wake = () => {};
  const stop = (why) => { run.stopped = why === 'lost' ? why : run.stopped || why; wake(); };
  Object.assign(run, { seq: 0, stopped: null, stop });
  running.set(run.run_id, run);
  // Heartbeat at a third of the lease; it doubles as the cancel poll and tells a zombie it lost the run.
  const beat = setInterval(() => heartbeat(run), (lease * 1000) / 3);
  const pause = (ms) => new Promise((resolve) => { wake = resolve; setTimeout(resolve, ms); });
  try {
    if (run.model !== echoModel) await handBack(run);
    else if ((await supersede(run)) === null) run.stop('lost');
    else if ((await append(run, [{ type: 'message_start', role: 'assistant' }])) === null) run.stop('lost');
    if (!run.refused) await end(run, run.stopped ? '' : await echo(run, pause));
  } catch (err) {
    await fail(run, err).catch((e) => log(`run ${run.run_id}: ending failed:`, e.message));
  } finally {
    clearInterval(beat);
    running.delete(run.run_id);
    claim();
  }
}

async function heartbeat(run) {
  try {
    const { rows: [hb] } = await pool.query(
      'SELECT * FROM runrow.heartbeat(run_id => $1, claim_token => $2, lease_seconds => $3)',
      [run.run_id, run.claim_token, lease]);
    if (!hb.owned) run.stop('lost');
    else if (hb.cancel_requested) run.stop('cancel');
  } catch (err) { log(`heartbeat ${run.run_id}:`, err.message); } // the next beat tries again
}

const finish = (run, status, result, error) => call(
  'SELECT runrow.finish_run(run_id => $1, claim_token => $2, status => $3, result => $4::jsonb, error => $5) AS ok',
  [run.run_id, run.claim_token, status, result && JSON.stringify(result), error?.slice(0, 10000)]);

async function end(run, text) {
  const lost = () => log(`run ${run.run_id}: lost its claim, standing down`);
  if (run.stopped === 'lost') return lost();
  if (run.stopped === 'drained') return release(run, 'drained: the worker stopped before the run ended');
  const cancelled = run.stopped === 'cancel';
  if ((await append(run, [{ type: 'message_stop', stop_reason: cancelled ? 'cancelled' : 'end_turn' }])) === null) {
    return lost();
  }
  const status = cancelled ? 'cancelled' : 'completed';
  const [{ ok }] = await finish(run, status, { text });
  return log(`run ${run.run_id}: ${ok ? status : 'already ended elsewhere'}`);
}

// A run of another model (an agent run, next to an agent fleet). claim_runs has no model filter, so it was
// claimed; it is handed back untouched for a worker of its model. defer_run gives the attempt back and
// journals run_requeued (deferred: true), nothing else; release_run would spend the attempt (failed at once
// at max_attempts = 1, the default), and ending it `failed` (as this worker did) lost a run the fleet could
// run. Nobody can claim it for retryIn: 1 s the first time this worker hands the run back, doubling per
// hand-back of the same run up to 60 s, so a run no worker on the queue can take costs two journal rows a
// minute, not two a poll, and one that can be taken waits at most a minute longer for it.
const handedBack = new Map(); // run_id -> hand-backs so far, for the newest 10,000 runs
async function handBack(run) {
  run.refused = true;
  const times = handedBack.get(run.run_id) ?? 0;
  handedBack.delete(run.run_id); // re-inserted: the Map keeps insertion order, the oldest go first
  handedBack.set(run.run_id, times + 1);
  if (handedBack.size > 10000) handedBack.delete(handedBack.keys().next().value);
  const retryIn = Math.min(60, 2 ** times);
  const reason = `worker.js runs model ${JSON.stringify(echoModel)} only, not ${JSON.stringify(run.model)}: `
    + 'handed back with its attempt for a worker of that model';
  const [{ outcome }] = await call(
    'SELECT runrow.defer_run(run_id => $1, claim_token => $2, retry_in => make_interval(secs => $3), '
      + 'reason => $4) AS outcome',
    [run.run_id, run.claim_token, retryIn, reason]);
  log(`run ${run.run_id}: ${outcome ?? 'fenced out (no longer ours)'} for ${retryIn} s: ${reason}`);
}

// The handler threw. A database outage that outlasted call()'s retries ends nothing: the lease lapses and
// a reaper requeues the run. Deterministic: `failed` now. Anything else: released with a backoff.
async function fail(run, err) {
  if (transient(err)) return log(`run ${run.run_id}: no database for a lease, giving the run up:`, err.message);
  if (deterministic(err)) {
    const error = `SQLSTATE ${err.code}: the database refused this run's data; not retried, every attempt `
      + `would fail the same way: ${err.message}`;
    const [{ ok }] = await finish(run, 'failed', null, error);
    return log(`run ${run.run_id}: ${ok ? 'failed' : 'already ended elsewhere'}: ${error}`);
  }
  // As pyworker/worker/backoff.py: 1 s, 2 s, 4 s ... per attempt, at most 300 s, half of it random jitter.
  const ceiling = Math.min(300, 2 ** Math.min(run.attempt - 1, 30));
  return release(run, String(err.message), ceiling / 2 + (ceiling / 2) * Math.random());
}

// Hand a run back: requeued while attempts are left (claimable again after retryIn seconds), else failed/dead.
async function release(run, error, retryIn = null) {
  const [{ outcome }] = await call(
    'SELECT runrow.release_run(run_id => $1, claim_token => $2, error => $3, '
      + 'retry_in => make_interval(secs => $4)) AS outcome',
    [run.run_id, run.claim_token, error.slice(0, 10000), retryIn]);
  log(`run ${run.run_id}: released, ${outcome ?? 'fenced out (no longer ours)'}: ${error}`);
}

async function claim() {
  // One claim in flight at a time; a wake that lands meanwhile is served by the loop below.
  if (claiming || stopping) return claiming;
  claiming = (async () => {
    while (!stopping && running.size < concurrency) {
      const { rows } = await pool.query(
        'SELECT * FROM runrow.claim_runs(worker_id => $1, max_runs => $2, lease_seconds => $3)',
        [workerId, concurrency - running.size, lease]);
      // A drain began while this claim was in flight: hand its runs back now rather than exit holding them
      // (one of another model with its attempt, as always).
      const drained = (run) => release(run, 'drained: claimed as the worker was stopping');
      if (stopping) await Promise.all(rows.map((run) => (run.model === echoModel ? drained(run) : handBack(run))));
      else rows.forEach((run) => execute(run));
      if (rows.length === 0) break;
    }
  })().catch((err) => log('claim failed:', err.message)).finally(() => { claiming = null; });
  return claiming;
}

// Every worker reaps (there is no singleton to lose): without it a run whose worker was killed stays
// `running` and its conversation's next turn stays queued. The same pass fires due schedules. Once at
// boot, then every lease, jittered so that a fleet started together does not sweep in lockstep.
async function reap() {
  try {
    let rows;
    do { // a full pass (100 runs) leaves more: go again at once
      ({ rows } = await pool.query(
        'SELECT run_id, outcome FROM runrow.reap_expired_runs(grace_seconds => $1, max_runs => 100)', [grace]));
      for (const r of rows) log(`reaped run ${r.run_id}: ${r.outcome}`);
    } while (rows.length === 100);
  } catch (err) { log('reap failed, trying again next pass:', err.message); }
  try { // 100 schedules a pass; again while a pass used its budget, as the Python reaper does: a pass
    // whose 100 ticks all enqueued nothing (if_active reject on a busy conversation) left the
    // schedules behind them due, and fire_schedules' 0 could not tell it from an empty pass
    for (let i = 0, more = true; i < 50 && more; i++) {
      const { enqueued, moved_on: movedOn } = (await pool.query(
        'SELECT enqueued, moved_on FROM runrow.fire_schedules_pass(max_schedules => 100)')).rows[0];
      if (enqueued > 0) log(`schedules: enqueued ${enqueued} run(s)`);
      more = movedOn === 100 || enqueued > 0;
    }
  } catch (err) { log('firing schedules failed, trying again next pass:', err.message); }
  if (!stopping) timers.reap = setTimeout(reap, lease * 1000 * (0.5 + Math.random()));
}

// One LISTEN connection: wakes on runrow_enqueued, stops on runrow_cancel. Lost, the runs in flight go on
// (the heartbeat still sees stops, the tick still claims): reconnect with a capped backoff, LISTEN again,
// and claim, since the wakes sent meanwhile were lost.
async function listen() {
  const client = new Client({ connectionString: url, application_name: workerId });
  let lost = false;
  const reconnect = (err) => {
    if (lost || stopping) return;
    [lost, listener] = [true, null];
    log(`LISTEN connection lost (${err.message}); reconnecting in ${listenWait} ms`);
    client.end().catch(() => {});
    timers.listen = setTimeout(listen, listenWait);
    listenWait = Math.min(listenWait * 2, 10000);
  };
  client.on('error', reconnect);
  client.on('end', () => reconnect(new Error('connection ended')));
  client.on('notification', (msg) => {
    // A cancel NOTIFY is a hint (any login may send one): beat now, and stop when the row says so.
    if (msg.channel === 'runrow_cancel') { const run = running.get(msg.payload); if (run) heartbeat(run); }
    else claim();
  });
  try {
    await client.connect();
    await client.query('LISTEN runrow_enqueued');
    await client.query('LISTEN runrow_cancel');
  } catch (err) { return reconnect(err); }
  [listener, listenWait] = [client, 250];
  log('listening');
  return void claim();
}

// SIGTERM/SIGINT: stop claiming, wait for a claim in flight (its runs are released), let the runs in flight
// finish for DRAIN_SECONDS, then stop and release the rest. A second signal releases them at once (exit 1).
async function drain() {
  const releaseHeld = () => running.forEach((run) => run.stop('drained'));
  if (stopping) { exitCode = 1; log('second signal: releasing the runs held now'); return releaseHeld(); }
  stopping = true;
  clearInterval(timers.tick);
  clearTimeout(timers.reap);
  clearTimeout(timers.listen);
  log('draining', running.size, 'runs, for up to', drainSeconds, 's');
  timers.drain = setTimeout(() => { log('drain budget spent'); releaseHeld(); }, drainSeconds * 1000);
  await claiming;
  while (running.size > 0) await sleep(50);
  clearTimeout(timers.drain);
  await listener?.end().catch(() => {});
  await pool.end().catch(() => {});
  process.exit(exitCode);
}

async function main() {
  process.on('SIGTERM', drain);
  process.on('SIGINT', drain);
  await listen();
  timers.tick = setInterval(claim, poll * 1000); // signals are hints, rows are truth
  reap();
}

main().catch((err) => { console.error('worker.js:', err.message); process.exit(1); });
