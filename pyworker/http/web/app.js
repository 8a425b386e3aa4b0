"use strict";
// The runrow chat page: plain JS, no build step.
//
// The stream is read with fetch() and a body reader rather than EventSource, so the
// Authorization header can be sent. Everything the page has rendered (each turn's run id,
// its text with the seq of each delta, and the seq of the last event applied) is written to
// sessionStorage in one piece after every event: a reload resumes the stream with
// Last-Event-ID = that seq, so the text continues where it was, with no gap and no
// duplicate. Closing the tab only ends the stream; Stop is a request of its own (a disconnect
// is not a stop).

const TERMINAL = new Set(["completed", "failed", "cancelled", "dead"]);
const TOKEN_KEY = "runrow.token"; // localStorage: asked once per browser
const CHAT_KEY = "runrow.chat"; // sessionStorage: this tab's conversation and transcript
const $ = (id) => document.getElementById(id);

// A new element with a class and text content (either may be omitted).
function el(tag, className = "", text = "") {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text) node.textContent = text;
  return node;
}

let authMode = "bearer";
let token = localStorage.getItem(TOKEN_KEY) || "";
let chat = loadChat();
let following = null; // {turn, controller} of the stream being read
let approvalsTimer = null;
const nodes = new WeakMap(); // turn -> its DOM node (kept out of the saved JSON)

// A UUIDv7 (RFC 9562): the time in milliseconds, then random bits. runrow indexes a
// conversation's finished turns by its id, and a time-ordered id puts a new conversation's
// entries beside other recent ones instead of on a random page of a history-sized index
// (README, "For DBAs": WAL and checkpoints). Idempotency keys are indexed the same way.
function newId() {
  const b = crypto.getRandomValues(new Uint8Array(16));
  let ms = Date.now();
  for (let i = 5; i >= 0; i--) {
    b[i] = ms % 256;
    ms = Math.floor(ms / 256);
  }
  b[6] = (b[6] & 0x0f) | 0x70;
  b[8] = (b[8] & 0x3f) | 0x80;
  const h = [...b].map((x) => x.toString(16).padStart(2, "0")).join("");
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
}

function loadChat() {
  try {
    const saved = JSON.parse(sessionStorage.getItem(CHAT_KEY) || "null");
    if (saved && saved.conversation && Array.isArray(saved.turns)) return saved;
  } catch (err) {
    console.warn("runrow: ignoring unreadable saved chat", err);
  }
  return { conversation: newId(), turns: [] };
}

function saveChat() {
  sessionStorage.setItem(CHAT_KEY, JSON.stringify(chat));
}

// --- talking to the service ---------------------------------------------------------

function authHeaders() {
  return authMode === "bearer" && token ? { Authorization: `Bearer ${token}` } : {};
}

class ApiError extends Error {
  constructor(status, type, message, retryAfter = null) {
    super(message);
    this.status = status;
    this.type = type;
    this.retryAfter = retryAfter; // seconds, from a 503's Retry-After
  }
}

async function api(method, path, body, headers = {}) {
  const res = await fetch(path, {
    method,
    headers: { ...authHeaders(), ...(body ? { "Content-Type": "application/json" } : {}), ...headers },
    body: body ? JSON.stringify(body) : undefined,
    cache: "no-store",
  });
  const data = await res.json().catch(() => ({}));
  if (res.status === 401) needToken();
  if (!res.ok) {
    const e = data.error || {};
    const wait = Number(res.headers.get("Retry-After"));
    throw new ApiError(res.status, e.type || "http_error", e.message || `HTTP ${res.status}`, wait > 0 ? wait : null);
  }
  return data;
}

// Parses a text/event-stream body into {id, event, data} frames; comments (keepalives) are skipped.
async function readEvents(body, onFrame) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value.replace(/\r\n?/g, "\n");
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      let id = null;
      let event = "message";
      const data = [];
      for (const line of block.split("\n")) {
        if (!line || line.startsWith(":")) continue;
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        let v = colon < 0 ? "" : line.slice(colon + 1);
        if (v.startsWith(" ")) v = v.slice(1);
        if (field === "id") id = Number(v);
        else if (field === "event") event = v;
        else if (field === "data") data.push(v);
      }
      if (id !== null && data.length) onFrame({ id, event, data: decodeNul(JSON.parse(data.join("\n"))) });
    }
  }
}

// An event whose text held U+0000 is journaled with "_encoding": "nul-percent" (jsonb cannot
// hold U+0000): in its strings "%00" stands for U+0000 and "%25" for "%" (pyworker/db/nul.py).
function decodeNul(value, encoded = false) {
  if (typeof value === "string") {
    return encoded ? value.replace(/%(00|25)/g, (m) => (m === "%00" ? "\0" : "%")) : value;
  }
  if (Array.isArray(value)) return value.map((v) => decodeNul(v, encoded));
  if (value === null || typeof value !== "object") return value;
  const marked = encoded || value._encoding === "nul-percent";
  const out = {};
  for (const [k, v] of Object.entries(value)) {
    if (!encoded && marked && k === "_encoding") continue;
    out[decodeNul(k, marked)] = decodeNul(v, marked);
  }
  return out;
}

// --- the conversation -----------------------------------------------------------------

function lastTurn() {
  return chat.turns[chat.turns.length - 1];
}

function isActive(turn) {
  return turn && !TERMINAL.has(turn.status);
}

async function send() {
  const text = $("message").value.trim();
  if (!text || isActive(lastTurn())) return;
  // The key makes the POST safe to repeat: a reload before the answer re-sends it and gets the same run.
  const turn = {
    user: text,
    key: newId(),
    runId: null,
    segments: [""], // the answer's text, one segment per model step
    parts: [], // [seq, segment, text] of every text delta, so a `superseded` can take some back
    tools: [], // tool calls, shown beside the text
    lastSeq: 0,
    status: "sending",
    error: null,
  };
  chat.turns.push(turn);
  saveChat();
  $("message").value = "";
  renderAll();
  await enqueue(turn);
}

// The POST is sent again, with the same Idempotency-Key, while the service answers 503 (its
// database is away: a restart, a failover) or cannot be reached, for up to a minute: the turn
// stays "sending" meanwhile, so a reload sends it again too. It was marked failed at the first
// 503, though the run may have been created (an answer lost after the commit) and run, paid for.
const ENQUEUE_PATIENCE_MS = 60_000;

async function enqueue(turn) {
  const giveUp = Date.now() + ENQUEUE_PATIENCE_MS;
  for (;;) {
    try {
      const run = await api(
        "POST",
        `/conversations/${chat.conversation}/runs`,
        { content: turn.user },
        { "Idempotency-Key": turn.key },
      );
      turn.runId = run.run_id;
      turn.status = run.status;
      turn.error = null;
      break;
    } catch (err) {
      // 503: the service's database is away; 502 and 504: a proxy in front lost the service.
      const transient = !(err instanceof ApiError) || [502, 503, 504].includes(err.status);
      if (!transient || Date.now() > giveUp) {
        turn.status = "failed";
        turn.error = err.message;
        break;
      }
      turn.error = `${err.message}: sending again`;
      renderTurn(turn);
      await new Promise((resolve) => setTimeout(resolve, 1000 * Math.min(err.retryAfter || 2, 30)));
    }
  }
  saveChat();
  renderTurn(turn);
  if (turn.runId) follow(turn);
  else setBusy(false);
}

function apply(turn, frame) {
  if (frame.id <= turn.lastSeq) return; // already applied before a reconnect
  const ev = frame.data;
  switch (frame.event) {
    case "text_delta":
      turn.segments[turn.segments.length - 1] += ev.text || "";
      (turn.parts ||= []).push([frame.id, turn.segments.length - 1, ev.text || ""]);
      break;
    case "superseded":
      supersede(turn, ev.after_seq, ev.through_seq);
      break;
    case "model_request":
      if (turn.segments[turn.segments.length - 1]) turn.segments.push("");
      break;
    case "tool_call": {
      // A resumed attempt journals its own tool_call for a call begun before: one chip per call.
      const call = turn.tools.find((t) => t.id === ev.tool_use_id);
      if (call) Object.assign(call, { name: ev.tool, done: false, error: false });
      else turn.tools.push({ id: ev.tool_use_id, name: ev.tool, done: false, error: false });
      break;
    }
    case "tool_result": {
      const call = turn.tools.find((t) => t.id === ev.tool_use_id);
      if (call) Object.assign(call, { done: true, error: !!ev.is_error });
      break;
    }
    case "run_claimed":
      turn.status = "running";
      break;
    case "run_requeued":
      turn.status = "queued";
      break;
    case "approval_requested":
      turn.status = "waiting";
      pollApprovals();
      break;
    case "approval_resolved":
      pollApprovals();
      break;
    case "complete":
      turn.status = ev.status;
      turn.error = ev.error || null;
      break;
    default:
      break;
  }
  turn.lastSeq = frame.id;
  saveChat(); // text and cursor together, so a reload never replays or skips an event
  renderTurn(turn);
}

// The deltas with after < seq <= through came from attempts that were cut off, and a later
// attempt redoes that work: they are not part of the answer (README, "The journal's events").
// The segments are rebuilt from the deltas kept; a segment left empty disappears.
function supersede(turn, after, through) {
  if (!Number.isInteger(after) || !Number.isInteger(through)) return;
  const kept = (turn.parts || []).filter(([seq]) => seq <= after || seq > through);
  if (kept.length === (turn.parts || []).length) return;
  const segments = [];
  let from = null;
  for (const part of kept) {
    if (part[1] !== from) {
      from = part[1];
      segments.push("");
    }
    part[1] = segments.length - 1;
    segments[segments.length - 1] += part[2];
  }
  turn.parts = kept;
  turn.segments = segments.length ? segments : [""];
}

async function follow(turn) {
  if (following) following.controller.abort();
  const controller = new AbortController();
  following = { turn, controller };
  setBusy(true);
  let delay = 250;
  while (isActive(turn) && !controller.signal.aborted) {
    try {
      const res = await fetch(`/runs/${turn.runId}/events`, {
        headers: { ...authHeaders(), "Last-Event-ID": String(turn.lastSeq) },
        signal: controller.signal,
        cache: "no-store",
      });
      if (res.status === 204) break; // the run ended and we had seen it all
      if (res.status === 401) {
        needToken();
        break;
      }
      if (res.status === 404) {
        turn.status = "failed";
        turn.error = "this run is not available to you";
        break;
      }
      if (!res.ok) throw new Error(`the stream answered ${res.status}`);
      status("");
      await readEvents(res.body, (frame) => apply(turn, frame));
      delay = 250;
    } catch (err) {
      if (controller.signal.aborted) return;
      status(`connection lost (${err.message}); reconnecting…`);
      await new Promise((r) => setTimeout(r, delay));
      delay = Math.min(delay * 2, 5000);
    }
  }
  saveChat();
  renderTurn(turn);
  if (following && following.controller === controller) following = null;
  setBusy(false);
}

async function stop() {
  $("stop").disabled = true;
  status("stopping…");
  try {
    await api("POST", `/conversations/${chat.conversation}/stop`);
  } catch (err) {
    status(`stop failed: ${err.message}`);
    $("stop").disabled = false;
  }
}

function newConversation() {
  if (following) following.controller.abort();
  following = null;
  chat = { conversation: newId(), turns: [] };
  saveChat();
  renderAll();
  setBusy(false);
}

// --- approvals ----------------------------------------------------------------------------

// Characters that reorder or hide text: bidi embeddings, overrides, isolates and marks, zero-width
// and other format characters, the soft hyphen, C1 controls, line/paragraph separators and tag
// characters. JSON.stringify leaves them as they are, so a tool call's arguments (the model's,
// attacker-influenced) could read as something else than what runs: `echo safe \u202e; fr- mr`
// displays as `echo safe rm -rf ;`. In an approval card they are shown as \uXXXX instead.
const DECEPTIVE =
  /[\u007f-\u009f\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b-\u180f\u200b-\u200f\u2028-\u202e\u2060-\u206f\u3164\ufe00-\ufe0f\ufeff\uffa0\ufff0-\ufffb]|[\u{e0000}-\u{e0fff}]/gu;

function visible(text) {
  return text.replace(DECEPTIVE, (c) => {
    const code = c.codePointAt(0).toString(16).padStart(4, "0");
    return code.length > 4 ? `\\u{${code}}` : `\\u${code}`;
  });
}

// GET /approvals answers a page at a time (at most 1000, asked for) with `next` while more remain:
// the page showed the first page only, so the 101st call waiting on this person never had a card.
// Every page is read before the list is replaced. The 3 s tick starts no walk while one is in
// flight: when walking took longer than 3 s every walk was overtaken by the next tick and drew
// nothing, and the overtaken ones kept fetching. A forced poll (a decision, an approval event,
// signing in) starts at once; the walk it overtakes stops at its next page and draws nothing.
const APPROVAL_LIMIT = 1000; // GET /approvals' most a page (pyworker/http/approval_pages.py)
const APPROVAL_PAGES = 10; // 10,000 cards at most: past that, `runrow approvals` lists them
let approvalsPoll = 0; // the latest walk's number
let approvalsWalking = 0; // walks in flight

async function pendingApprovals(mine) {
  const approvals = [];
  let after = null;
  for (let i = 0; i < APPROVAL_PAGES && mine === approvalsPoll; i++) {
    const cursor = after === null ? "" : `&after=${encodeURIComponent(after)}`;
    const page = await api("GET", `/approvals?limit=${APPROVAL_LIMIT}${cursor}`);
    approvals.push(...page.approvals);
    after = page.next ?? null;
    if (after === null) break;
  }
  return approvals;
}

async function pollApprovals({ forced = true } = {}) {
  if (authMode === "bearer" && !token) return;
  if (!forced && approvalsWalking > 0) return;
  const mine = ++approvalsPoll;
  let approvals = [];
  approvalsWalking++;
  try {
    approvals = await pendingApprovals(mine);
  } catch (err) {
    return;
  } finally {
    approvalsWalking--;
  }
  if (mine !== approvalsPoll) return;
  const list = $("approval-list");
  list.replaceChildren();
  for (const a of approvals) {
    const li = el("li");
    li.dataset.key = a.idempotency_key;
    const why = a.reason === "uncertain" ? " (started, no result: did it happen?)" : "";
    const what = el("div", "what");
    // What the person approves, and where it comes from: the effect and the run and
    // conversation it belongs to (a card alone could be another conversation's).
    what.append(
      el("code", "", `${visible(a.tool)}(${visible(JSON.stringify(a.args))})${why}`),
      el("small", "origin", `${a.effect} · run ${a.run_id} · conversation ${a.conversation_id}`),
    );
    const yes = el("button", "approve", a.reason === "uncertain" ? "Run it" : "Approve");
    yes.onclick = () => decide(a.idempotency_key, true);
    const no = el("button", "reject", "Reject");
    no.onclick = () => decide(a.idempotency_key, false);
    li.append(what, yes, no);
    list.append(li);
  }
  $("approvals").hidden = approvals.length === 0;
}

async function decide(key, approved) {
  try {
    await api("POST", `/approvals/${encodeURIComponent(key)}`, { approved });
  } catch (err) {
    status(`decision failed: ${err.message}`);
  }
  pollApprovals();
}

// --- rendering ------------------------------------------------------------------------------

function status(text) {
  $("status").textContent = text;
}

function setBusy(busy) {
  $("send").disabled = busy;
  $("stop").disabled = !busy;
  if (!busy) status("");
}

function describe(turn) {
  switch (turn.status) {
    case "sending":
      return "sending…";
    case "queued":
      return "queued";
    case "running":
      return "answering…";
    case "waiting":
      return "waiting for your approval";
    case "completed":
      return "";
    case "cancelled":
      return "stopped";
    default:
      return turn.error ? `${turn.status}: ${turn.error}` : turn.status;
  }
}

function turnNode(turn) {
  const node = el("div", "turn");
  const user = el("div", "user");
  user.append(el("div", "bubble", turn.user));
  const assistant = el("div", "assistant");
  assistant.append(el("div", "bubble"), el("div", "tools"), el("div", "meta"));
  node.append(user, assistant);
  nodes.set(turn, node);
  return node;
}

function renderTurn(turn) {
  const node = nodes.get(turn);
  if (!node) return renderAll();
  const assistant = node.querySelector(".assistant");
  assistant.className = `assistant ${turn.status}${isActive(turn) ? " streaming" : ""}`;
  assistant.dataset.runId = turn.runId || "";
  assistant.dataset.seq = String(turn.lastSeq);
  // One block per model step; the bubble's textContent stays exactly the journal's text.
  const bubble = assistant.querySelector(".bubble");
  while (bubble.children.length < turn.segments.length) bubble.append(el("div"));
  while (bubble.children.length > turn.segments.length) bubble.lastChild.remove();
  turn.segments.forEach((text, i) => {
    if (bubble.children[i].textContent !== text) bubble.children[i].textContent = text;
  });
  const tools = assistant.querySelector(".tools");
  tools.replaceChildren(
    ...turn.tools.map((t) =>
      el(
        "span",
        `tool${t.error ? " error" : ""}${t.done ? " done" : ""}`,
        `${t.name} ${t.error ? "✗" : t.done ? "✓" : "…"}`,
      ),
    ),
  );
  assistant.querySelector(".meta").textContent = describe(turn);
  const main = document.querySelector("main");
  main.scrollTop = main.scrollHeight;
}

function renderAll() {
  const transcript = $("transcript");
  transcript.replaceChildren(...chat.turns.map(turnNode));
  chat.turns.forEach(renderTurn);
  $("conversation").textContent = chat.conversation.slice(0, 8);
  $("conversation").title = `conversation ${chat.conversation}`;
}

// --- start ----------------------------------------------------------------------------------

function needToken() {
  token = "";
  localStorage.removeItem(TOKEN_KEY);
  $("token-form").hidden = false;
  $("forget-token").hidden = true;
  $("who").textContent = "";
  $("token").focus();
}

function resume() {
  renderAll();
  const turn = lastTurn();
  if (turn && turn.status === "sending" && !turn.runId) enqueue(turn);
  else if (turn && turn.runId && isActive(turn)) follow(turn);
  else setBusy(false);
  pollApprovals();
  clearInterval(approvalsTimer);
  approvalsTimer = setInterval(() => pollApprovals({ forced: false }), 3000);
}

async function start() {
  $("composer").addEventListener("submit", (e) => {
    e.preventDefault();
    send();
  });
  $("message").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey) {
      e.preventDefault();
      send();
    }
  });
  $("stop").addEventListener("click", stop);
  $("new-conversation").addEventListener("click", newConversation);
  $("forget-token").addEventListener("click", needToken);
  renderAll(); // this tab's transcript, at once: nothing to wait for before it shows
  $("token-form").addEventListener("submit", (e) => {
    e.preventDefault();
    token = $("token").value.trim();
    if (!token) return;
    localStorage.setItem(TOKEN_KEY, token);
    $("token").value = "";
    $("token-form").hidden = true;
    $("forget-token").hidden = false;
    $("who").textContent = "signed in with a token";
    resume();
  });
  try {
    authMode = (await (await fetch("/config", { cache: "no-store" })).json()).auth;
  } catch (err) {
    status("cannot reach the runrow service");
  }
  if (authMode === "dev") {
    $("who").textContent = "insecure dev mode: you are user dev";
  } else if (!token) {
    renderAll();
    return needToken();
  } else {
    $("who").textContent = "signed in with a token";
    $("forget-token").hidden = false;
  }
  resume();
}

start();
