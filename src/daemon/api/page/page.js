// flotilla's live page (ADR-034). It reads the daemon's own API: the run list, a run's
// status (GET /v1/runs/ID, the graph as the daemon folds it), a task's story, and the run's
// event stream (SSE), which makes it fetch the status again (coalesced: one fetch at a time,
// one more if events came meanwhile). Nothing polls.
//
// Everything shown that a model or an agent wrote (descriptions, summaries, handoffs,
// failures) goes into text nodes (textContent), never into markup.
"use strict";

// Every event kind the daemon streams (the SSE `event:` is the kind's name); a unit test
// holds this list to the Rust enum.
const KINDS = [
  "run_started", "planner_responded", "planner_gave_up", "task_added", "tasks_rejected",
  "task_ready", "task_dispatched", "task_started", "task_retried", "task_interrupted",
  "review_verdict",
  "task_completed", "task_failed", "task_cancelled", "decomposition_accepted",
  "subtasks_added", "decomposition_closed", "subplanner_responded", "task_atomic",
  "decomposition_rejected", "proposals_stopped", "subtasks_completed",
  "awaiting_user_decision", "landing_allowed", "task_landing", "task_landed",
  "fix_task_added", "merge_conflict", "merge_gate_failed", "main_moved", "landing_intended",
  "landing_requeued", "main_diverged", "sweep_finished", "sweep_stale",
  "finalization_started", "message_ignored", "planning_finished", "run_cancel_requested",
  "spend_charged", "run_budget_exhausted", "run_finished", "run_restarted",
  "journal_unavailable", "storage_unavailable", "llm_progress", "provider_paused",
  "agent_activity", "main_adopted", "provider_pause_started", "provider_resumed",
  "tools_ran",
];
// Notices that change nothing the status shows: listed, not fetched for.
const QUIET = new Set(["llm_progress", "agent_activity", "provider_paused", "tools_ran"]);
const MERGE_KINDS = new Set([
  "merge_conflict", "merge_gate_failed", "main_moved", "landing_requeued", "task_landed",
  "main_diverged", "main_adopted", "sweep_finished", "sweep_stale", "finalization_started",
]);
const STATES = [
  "pending", "ready", "dispatched", "running", "waiting_for_subtasks", "synthesizing",
  "landing", "completed", "failed", "cancelled",
];
const MAX_LOG = 300;
const MAX_NODES = 3000;
const SVG = "http://www.w3.org/2000/svg";

const page = {
  run: null,
  status: null,
  source: null,
  finished: false,
  fetching: false,
  again: false,
  selected: null,
  sweep: null,
  diverged: null,
  renders: 0,
  waiters: [],
};

// For people and tests alike: `flotilla.until(() => cond)` resolves once a render makes
// `cond` true (at once if it already is).
window.flotilla = {
  until(cond) {
    return new Promise((resolve) => {
      if (cond()) resolve(true);
      else page.waiters.push({ cond, resolve });
    });
  },
  tasksShown() {
    return Array.from(document.querySelectorAll("g.node"), (g) => g.dataset.task);
  },
  status() {
    return page.status;
  },
};

function rendered() {
  page.renders += 1;
  page.waiters = page.waiters.filter((w) => {
    if (w.cond()) {
      w.resolve(true);
      return false;
    }
    return true;
  });
}

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

function svg(tag, attrs) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
  return e;
}

function clear(node) {
  while (node.firstChild) node.removeChild(node.firstChild);
}

function cut(text, n) {
  const s = String(text ?? "");
  return s.length > n ? s.slice(0, n - 1) + "…" : s;
}

function enc(s) {
  return encodeURIComponent(s);
}

async function getJson(path) {
  const answer = await fetch(path, { credentials: "same-origin", cache: "no-store" });
  const body = await answer.json().catch(() => ({}));
  if (!answer.ok) throw new Error(body.error || `${answer.status} ${answer.statusText}`);
  return body;
}

function showProblem(text) {
  const p = document.getElementById("problem");
  p.hidden = !text;
  p.textContent = text || "";
}

async function start() {
  legend();
  const wanted = new URLSearchParams(location.search).get("run");
  let runs = [];
  try {
    runs = await getJson("/v1/runs");
  } catch (e) {
    showProblem(`cannot list the runs: ${e.message} (run \`flotilla ui\` for a new link)`);
    document.body.dataset.runState = "error";
    rendered();
    return;
  }
  const select = document.getElementById("runs");
  for (const r of runs.slice().reverse()) {
    const option = el("option", `${r.id.slice(0, 8)} ${r.state} ${cut(r.request, 50)}`);
    option.value = r.id;
    select.appendChild(option);
  }
  select.addEventListener("change", () => {
    location.search = `?run=${enc(select.value)}`;
  });
  const running = runs.filter((r) => r.state === "running");
  const chosen = wanted || (running.length ? running[running.length - 1].id : runs.length ? runs[runs.length - 1].id : null);
  if (!chosen) {
    showProblem("no runs yet: start one with `flotilla submit`");
    document.body.dataset.runState = "none";
    rendered();
    return;
  }
  page.run = chosen;
  select.value = runs.some((r) => r.id === chosen) ? chosen : select.value;
  await refresh();
  follow();
}

// Fetches the run's status again; coalesces calls that come while one is under way.
async function refresh() {
  if (page.fetching) {
    page.again = true;
    return;
  }
  page.fetching = true;
  try {
    do {
      page.again = false;
      try {
        const status = await getJson(`/v1/runs/${enc(page.run)}`);
        page.status = status;
        page.run = status.id;
        showProblem(status.problem || "");
        render();
      } catch (e) {
        showProblem(`cannot read the run: ${e.message}`);
      }
    } while (page.again);
  } finally {
    page.fetching = false;
  }
  rendered();
}

function follow() {
  const source = new EventSource(`/v1/runs/${enc(page.run)}/events`);
  page.source = source;
  const stream = document.getElementById("stream");
  source.onopen = () => {
    stream.textContent = "live";
  };
  source.onerror = () => {
    if (page.finished) {
      source.close();
      stream.textContent = "finished";
    } else if (source.readyState === EventSource.CLOSED) {
      // Refused (not a dropped connection, which the browser retries by itself).
      stream.textContent = "disconnected: reload, or run `flotilla ui` for a new link";
    } else {
      stream.textContent = "reconnecting…";
    }
  };
  for (const kind of KINDS) {
    source.addEventListener(kind, (message) => {
      let event;
      try {
        event = JSON.parse(message.data);
      } catch (_) {
        return;
      }
      onEvent(event);
    });
  }
}

function onEvent(event) {
  logEvent(event);
  const kind = event.kind;
  const data = event.data || {};
  if (kind === "sweep_finished") page.sweep = data.report;
  if (kind === "main_diverged") page.diverged = data;
  if (kind === "main_adopted" || kind === "main_moved") page.diverged = null;
  if (MERGE_KINDS.has(kind)) logMerge(event);
  if (kind === "run_finished") {
    page.finished = true;
    if (page.source) page.source.close();
    document.getElementById("stream").textContent = "finished";
  }
  if (!QUIET.has(kind)) refresh();
  if (page.selected && mentions(data, page.selected) && !QUIET.has(kind)) showTask(page.selected);
}

function mentions(data, task) {
  return data.task === task || data.parent === task || (Array.isArray(data.tasks) && data.tasks.includes(task));
}

function eventTask(data) {
  return data.task || data.parent || (Array.isArray(data.tasks) ? data.tasks.join(",") : "");
}

function time(ms) {
  const d = new Date(ms);
  return d.toTimeString().slice(0, 8);
}

function logEvent(event) {
  const list = document.getElementById("events");
  const data = event.data || {};
  const words = [event.seq ? `#${event.seq}` : "·", time(event.at_ms), event.kind, eventTask(data)];
  if (data.activity) words.push(cut(data.activity, 160));
  if (data.reason && typeof data.reason === "string") words.push(cut(data.reason, 160));
  list.insertBefore(el("li", words.filter(Boolean).join(" ")), list.firstChild);
  while (list.childNodes.length > MAX_LOG) list.removeChild(list.lastChild);
}

function logMerge(event) {
  const list = document.getElementById("merges");
  const d = event.data || {};
  let text = `${time(event.at_ms)} ${event.kind}`;
  if (event.kind === "main_moved") text += ` ${cut(d.from, 8)}→${cut(d.to, 8)} ${(d.tasks || []).join(", ")}`;
  else if (event.kind === "merge_conflict") text += ` ${d.task} in ${(d.files || []).join(", ")}${d.retrying ? " (retrying)" : ""}`;
  else if (event.kind === "merge_gate_failed") text += ` ${(d.tasks || []).join(", ")}: ${cut(d.command, 80)}`;
  else if (event.kind === "sweep_finished" && d.report) text += ` ${d.report.green ? "green" : "red"} at ${cut(d.report.commit, 8)}`;
  else text += ` ${eventTask(d)}`;
  list.insertBefore(el("li", text), list.firstChild);
  while (list.childNodes.length > 100) list.removeChild(list.lastChild);
}

function legend() {
  const box = document.getElementById("legend");
  for (const s of STATES) {
    const item = el("span", s.replaceAll("_", " "));
    const swatch = el("i", null, `legend-${s}`);
    item.insertBefore(swatch, item.firstChild);
    box.appendChild(item);
  }
}

function render() {
  const status = page.status;
  document.body.dataset.runState = status.state;
  const badge = document.getElementById("run-state");
  badge.textContent = status.state;
  badge.className = `badge ${status.state}`;
  document.getElementById("request").textContent = status.request;
  const option = Array.from(document.getElementById("runs").options).find((o) => o.value === status.id);
  if (option) option.textContent = `${status.id.slice(0, 8)} ${status.state} ${cut(status.request, 50)}`;
  const c = status.counts || {};
  document.getElementById("counts").textContent =
    `${c.total || 0} tasks: ${c.completed || 0} completed, ${c.running || 0} running, ${c.pending || 0} pending, ` +
    `${c.waiting || 0} waiting, ${c.landing || 0} landing, ${c.failed || 0} failed, ${c.cancelled || 0} cancelled` +
    (status.graph.finish_reason ? ` — ${status.graph.finish_reason}` : "");
  renderSpend(status.graph);
  renderMain(status);
  renderGraph(status);
}

function renderSpend(graph) {
  const body = document.querySelector("#spend tbody");
  clear(body);
  const spent = graph.run_spent || {};
  const budget = graph.run_budget || {};
  const rows = [
    ["tokens", spent.tokens, budget.tokens, (v) => Number(v || 0).toLocaleString()],
    ["cost", spent.cost_usd, budget.cost_usd, (v) => `$${Number(v || 0).toFixed(4)}`],
    ["time", spent.wall_time_ms, budget.wall_time_ms, (v) => `${Math.round(Number(v || 0) / 1000)} s`],
  ];
  for (const [name, s, b, fmt] of rows) {
    const tr = el("tr");
    tr.appendChild(el("td", name));
    tr.appendChild(el("td", `${fmt(s)} of ${b ? fmt(b) : "no limit"}`));
    const cell = el("td");
    if (b) {
      const bar = el("progress");
      bar.max = Number(b);
      bar.value = Math.min(Number(s || 0), Number(b));
      cell.appendChild(bar);
    }
    tr.appendChild(cell);
    body.appendChild(tr);
  }
}

function renderMain(status) {
  const health = document.getElementById("main-health");
  const diverged = status.main_diverged || page.diverged;
  if (diverged) {
    health.textContent = `landing paused: main was moved (expected ${cut(diverged.expected, 10)}, found ${cut(diverged.actual, 10)}); flotilla decide RUN --adopt-main`;
    health.className = "health red";
  } else if (page.sweep) {
    const s = page.sweep;
    health.textContent = s.green
      ? `green at ${cut(s.commit, 10)} (sweep ${s.sweep})`
      : `red at ${cut(s.commit, 10)}: ${s.failures} failure(s)${s.class ? `, ${s.class}` : ""}`;
    health.className = `health ${s.green ? "green" : "red"}`;
  } else {
    health.textContent = "no sweep yet";
    health.className = "health unknown";
  }
  const queue = document.getElementById("queue");
  clear(queue);
  const landing = status.graph.tasks.filter((t) => t.state === "landing");
  for (const t of landing) {
    const waits = (status.awaiting_decision || []).includes(t.id) ? " (waits for your decision)" : "";
    queue.appendChild(el("li", `${t.id} ${cut(t.description, 60)}${waits}`));
  }
  if (!landing.length) queue.appendChild(el("li", "empty"));
}

// Columns by depth: a task stands right of what it depends on and of its parent.
function layout(tasks) {
  const byId = new Map(tasks.map((t) => [t.id, t]));
  const depth = new Map();
  const visiting = new Set();
  function depthOf(id) {
    if (depth.has(id)) return depth.get(id);
    const t = byId.get(id);
    if (!t || visiting.has(id)) return 0;
    visiting.add(id);
    let d = 0;
    for (const dep of t.depends_on || []) if (byId.has(dep)) d = Math.max(d, depthOf(dep) + 1);
    if (t.parent && byId.has(t.parent)) d = Math.max(d, depthOf(t.parent) + 1);
    visiting.delete(id);
    depth.set(id, d);
    return d;
  }
  const columns = [];
  for (const t of tasks) {
    const d = depthOf(t.id);
    (columns[d] = columns[d] || []).push(t);
  }
  return columns.map((c) => c || []);
}

function renderGraph(status) {
  const graph = document.getElementById("graph");
  clear(graph);
  const all = status.graph.tasks;
  const tasks = all.slice(0, MAX_NODES);
  const awaiting = new Set(status.awaiting_decision || []);
  const W = 210, H = 46, GX = 56, GY = 12, PAD = 12;
  const columns = layout(tasks);
  const at = new Map();
  let maxRows = 0;
  columns.forEach((column, x) => {
    maxRows = Math.max(maxRows, column.length);
    column.forEach((t, y) => at.set(t.id, { x: PAD + x * (W + GX), y: PAD + y * (H + GY) }));
  });
  const width = PAD * 2 + Math.max(1, columns.length) * (W + GX);
  const height = PAD * 2 + Math.max(1, maxRows) * (H + GY);
  graph.setAttribute("width", width);
  graph.setAttribute("height", height);
  graph.setAttribute("viewBox", `0 0 ${width} ${height}`);
  const edges = svg("g");
  const nodes = svg("g");
  graph.appendChild(edges);
  graph.appendChild(nodes);
  function edge(from, to, cls) {
    const a = at.get(from), b = at.get(to);
    if (!a || !b) return;
    const x1 = a.x + W, y1 = a.y + H / 2, x2 = b.x, y2 = b.y + H / 2;
    const mid = (x1 + x2) / 2;
    edges.appendChild(svg("path", { d: `M${x1},${y1} C${mid},${y1} ${mid},${y2} ${x2},${y2}`, class: cls }));
  }
  for (const t of tasks) {
    for (const dep of t.depends_on || []) edge(dep, t.id, "dep");
    if (t.parent) edge(t.parent, t.id, "child");
    const p = at.get(t.id);
    const classes = ["node"];
    if (t.id === page.selected) classes.push("selected");
    if (awaiting.has(t.id)) classes.push("awaiting");
    const g = svg("g", { class: classes.join(" "), transform: `translate(${p.x},${p.y})`, tabindex: 0 });
    g.dataset.task = t.id;
    g.dataset.state = t.state;
    const title = svg("title");
    title.textContent = `${t.id} (${t.state.replaceAll("_", " ")}, attempt ${t.attempt}): ${cut(t.description, 400)}`;
    g.appendChild(title);
    g.appendChild(svg("rect", { width: W, height: H, rx: 6, class: `state-${t.state}` }));
    const label = svg("text", { x: 8, y: 17 });
    label.textContent = `${t.id} · ${t.state.replaceAll("_", " ")}${t.attempt > 1 ? ` · try ${t.attempt}` : ""}`;
    g.appendChild(label);
    const desc = svg("text", { x: 8, y: 35, class: "desc" });
    desc.textContent = cut(t.description, 32);
    g.appendChild(desc);
    g.addEventListener("click", () => select(t.id));
    g.addEventListener("keydown", (e) => {
      if (e.key === "Enter") select(t.id);
    });
    nodes.appendChild(g);
  }
  if (all.length > tasks.length) {
    const more = svg("text", { x: PAD, y: height - 2 });
    more.textContent = `${all.length - tasks.length} more tasks not drawn (flotilla status shows them all)`;
    graph.appendChild(more);
  }
}

function select(task) {
  page.selected = task;
  for (const g of document.querySelectorAll("g.node")) g.classList.toggle("selected", g.dataset.task === task);
  showTask(task);
}

async function showTask(task) {
  const pane = document.getElementById("task-pane");
  const body = document.getElementById("task-body");
  pane.hidden = false;
  const view = page.status && page.status.graph.tasks.find((t) => t.id === task);
  document.getElementById("task-title").textContent = view ? `${task}: ${view.state.replaceAll("_", " ")}` : task;
  let story;
  try {
    story = await getJson(`/v1/runs/${enc(page.run)}/tasks/${enc(task)}`);
  } catch (e) {
    clear(body);
    body.appendChild(el("p", `cannot read the task: ${e.message}`, "problem"));
    rendered();
    return;
  }
  if (page.selected !== task) return;
  clear(body);
  if (view) {
    body.appendChild(el("p", view.description));
    if (view.scope && view.scope.length) body.appendChild(el("p", `scope: ${view.scope.join(", ")}`));
    body.appendChild(el("p", `spent ${Number(view.spent.tokens).toLocaleString()} tokens, $${Number(view.spent.cost_usd).toFixed(4)}`));
    if (view.summary) section(body, "Summary", view.summary);
    if (view.failure) section(body, "Failure", pretty(view.failure));
  }
  const attempts = new Map();
  const attempt = (n) => {
    if (!attempts.has(n)) attempts.set(n, []);
    return attempts.get(n);
  };
  for (const e of story.events) {
    const d = e.data || {};
    // A parent's decomposition events carry the parent's attempt: only this task's count.
    if (typeof d.attempt === "number" && (d.task === task || d.parent === task)) attempt(d.attempt).push(e);
  }
  body.appendChild(el("h3", `Attempts (${attempts.size})`));
  for (const [n, events] of [...attempts.entries()].sort((a, b) => a[0] - b[0])) {
    const box = el("div", null, "attempt");
    box.appendChild(el("strong", `attempt ${n}`));
    for (const e of events) {
      const d = e.data || {};
      let line = `${time(e.at_ms)} ${e.kind}`;
      if (d.profile) line += ` (${d.profile})`;
      box.appendChild(el("div", line));
      if (d.failure) box.appendChild(el("pre", pretty(d.failure)));
      if (d.reason && e.kind !== "decomposition_accepted") box.appendChild(el("pre", pretty(d.reason)));
      if (d.handoff) handoff(box, d.handoff);
    }
    body.appendChild(box);
  }
  const landed = story.events.filter((e) => e.kind === "task_landed" || e.kind === "merge_conflict");
  for (const e of landed) body.appendChild(el("p", `${e.kind}: ${pretty(e.data)}`));
  if (story.omitted) body.appendChild(el("p", `${story.omitted} older events left out`));
  rendered();
}

function section(parent, title, text) {
  parent.appendChild(el("h3", title));
  parent.appendChild(el("pre", text));
}

function list(parent, title, items) {
  if (!items || !items.length) return;
  parent.appendChild(el("h3", title));
  const ul = el("ul");
  for (const item of items) ul.appendChild(el("li", typeof item === "string" ? item : pretty(item)));
  parent.appendChild(ul);
}

function handoff(parent, h) {
  section(parent, `Handoff (${h.status})`, h.summary);
  list(parent, "Files changed", h.files_changed);
  list(parent, "Findings", (h.findings || []).map(finding));
  list(parent, "Concerns", h.concerns);
  list(parent, "Suggestions", h.suggestions);
  if (h.build_exit_code !== null && h.build_exit_code !== undefined) parent.appendChild(el("p", `build exit code ${h.build_exit_code}`));
}

function finding(f) {
  const rest = Object.assign({}, f);
  delete rest.finding;
  const words = Object.entries(rest).map(([k, v]) => `${k}: ${Array.isArray(v) ? v.join(", ") : typeof v === "object" ? JSON.stringify(v) : v}`);
  return `${String(f.finding).replaceAll("_", " ")}${words.length ? ` — ${words.join("; ")}` : ""}`;
}

function pretty(value) {
  if (typeof value === "string") return value;
  return cut(JSON.stringify(value, null, 1), 4000);
}

start();
