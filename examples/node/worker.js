// A runrow worker in Node.js: the same queue as the Python worker, through the runrow.* SQL API only.
// Handler: echo (streams metadata.echo back over metadata.duration seconds), like pyworker's echo.
// Env: DATABASE_URL, CONCURRENCY (2), LEASE_SECONDS (30), POLL_SECONDS (5), WORKER_ID (node-<host>-<pid>).
'use strict';
const os = require('os');
const { Client, Pool } = require('pg');

const url = process.env.DATABASE_URL;
if (!url) { console.error('worker.js: set DATABASE_URL'); process.exit(2); }
const concurrency = Number(process.env.CONCURRENCY || 2);
const lease = Number(process.env.LEASE_SECONDS || 30);
const poll = Number(process.env.POLL_SECONDS || 5);
const workerId = process.env.WORKER_ID || `node-${os.hostname()}-${process.pid}`;
const pool = new Pool({ connectionString: url, max: concurrency + 1 });
const running = new Map(); // run_id -> { stop(reason) }: the cancel NOTIFY and the heartbeat end a run early
let stopping = false;
let claiming = null;
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const log = (...args) => console.log(new Date().toISOString(), workerId, ...args);

async function claim() {
  // One claim in flight at a time; a wake that lands meanwhile is served by the loop below.
  if (claiming) return claiming;
  claiming = (async () => {
    while (!stopping && running.size < concurrency) {
      const { rows } = await pool.query(
        'SELECT * FROM runrow.claim_runs(worker_id => $1, max_runs => $2, lease_seconds => $3)',
        [workerId, concurrency - running.size, lease]);
      if (rows.length === 0) break;
      for (const run of rows) execute(run);
    }
  })().catch((err) => log('claim failed:', err.message)).finally(() => { claiming = null; });
  return claiming;
}

async function execute(run) {
  let stopped = null;
  let wake = () => {};
  running.set(run.run_id, { stop: (why) => { stopped = stopped || why; wake(); } });
  const { run_id: id, claim_token: token } = run;
  // Heartbeat at a third of the lease; it doubles as the cancel poll and tells a zombie it lost the run.
  const beat = setInterval(async () => {
    try {
      const { rows: [hb] } = await pool.query(
        'SELECT * FROM runrow.heartbeat(run_id => $1, claim_token => $2, lease_seconds => $3)', [id, token, lease]);
      if (!hb.owned) running.get(id)?.stop('lost');
      else if (hb.cancel_requested) running.get(id)?.stop('cancel');
    } catch (err) { log(`heartbeat ${id}:`, err.message); }
  }, (lease * 1000) / 3);
  const append = (events) => pool.query(
    'SELECT runrow.append_events(run_id => $1, claim_token => $2, events => $3::jsonb) AS seq',
    [id, token, JSON.stringify(events)]).then((r) => r.rows[0].seq);
  try {
    const meta = run.metadata || {};
    const text = String(meta.echo ?? 'echo');
    const steps = Math.max(1, Math.floor(Number(meta.duration ?? 0.5) / 0.05));
    let sent = '';
    if ((await append([{ type: 'message_start', role: 'assistant' }])) === null) stopped = 'lost';
    for (let i = 0; i < steps && !stopped; i++) {
      const piece = text.slice(Math.floor((i * text.length) / steps), Math.floor(((i + 1) * text.length) / steps));
      // A NULL seq: fenced out (reaped, or finished by someone else); stand down, write nothing more.
      if (piece && (await append([{ type: 'text_delta', index: 0, text: piece }])) === null) stopped = 'lost';
      else sent += piece;
      await new Promise((resolve) => { wake = resolve; setTimeout(resolve, (Number(meta.duration ?? 0.5) * 1000) / steps); });
    }
    if (stopped === 'lost') { log(`run ${id}: lost its claim, standing down`); return; }
    const status = stopped ? 'cancelled' : 'completed';
    await append([{ type: 'message_stop', stop_reason: stopped ? 'cancelled' : 'end_turn' }]);
    const { rows: [done] } = await pool.query(
      'SELECT runrow.finish_run(run_id => $1, claim_token => $2, status => $3, result => $4::jsonb) AS ok',
      [id, token, status, JSON.stringify({ text: sent })]);
    log(`run ${id}: ${done.ok ? status : 'already ended elsewhere'}`);
  } catch (err) {
    log(`run ${id} failed:`, err.message);
    await pool.query('SELECT runrow.release_run(run_id => $1, claim_token => $2, error => $3)', [id, token, err.message])
      .catch((e) => log(`release ${id}:`, e.message));
  } finally {
    clearInterval(beat);
    running.delete(id);
    claim();
  }
}

async function main() {
  // One LISTEN connection: wakes on runrow_enqueued (a turn became claimable), stops on runrow_cancel.
  const listener = new Client({ connectionString: url });
  await listener.connect();
  listener.on('notification', (msg) => {
    if (msg.channel === 'runrow_cancel') running.get(msg.payload)?.stop('cancel');
    else claim();
  });
  listener.on('error', (err) => { log('LISTEN connection lost:', err.message); process.exit(1); });
  await listener.query('LISTEN runrow_enqueued');
  await listener.query('LISTEN runrow_cancel');
  const ticker = setInterval(claim, poll * 1000); // signals are hints, rows are truth
  const drain = async () => {
    if (stopping) process.exit(1);
    stopping = true;
    log('draining', running.size, 'runs');
    clearInterval(ticker);
    while (running.size > 0) await sleep(50);
    await listener.end();
    await pool.end();
    process.exit(0);
  };
  process.on('SIGTERM', drain);
  process.on('SIGINT', drain);
  log('listening');
  await claim();
}

main().catch((err) => { console.error('worker.js:', err.message); process.exit(1); });
