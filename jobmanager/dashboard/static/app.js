// Weir dashboard: reads the job manager's REST API and redraws every
// REFRESH_MS. Plain DOM, no dependencies; every value comes from the API.
"use strict";

const REFRESH_MS = 2000;
const SVG = "http://www.w3.org/2000/svg";
let selected = null;      // job id shown in the job section
const previous = {};      // vertex id -> {at, read, write, bp}: for per-second rates
const rates = {};         // vertex id -> {read, write, bp}

// Authentication: the token is asked for once (one prompt however many
// requests got 401 at the same time) and kept for the tab. If the job
// manager refuses it, or the user dismisses the prompt, the page says so and
// asks again only when the user clicks "enter token": it never loops.
let tokenPrompt = null;    // the prompt in progress, shared by concurrent 401s
let tokenProblem = null;   // why requests go unauthenticated, until the user acts

class ApiError extends Error {
  constructor(kind, message) { super(message); this.kind = kind; }
}

function askToken(why) {
  if (!tokenPrompt) {
    tokenPrompt = Promise.resolve().then(() => {
      const t = window.prompt(why + "\nThe job manager requires its token (streamctl jobmanager --auth-token-file):");
      if (t && t.trim()) {
        sessionStorage.setItem("weir-token", t.trim());
        tokenProblem = null;
        return true;
      }
      tokenProblem = "no token given: the job manager requires one";
      return false;
    }).finally(() => { tokenPrompt = null; });
  }
  return tokenPrompt;
}

// request sends one request with the token kept for the tab, if any; it
// answers the response and the token it carried.
async function request(path, init) {
  const headers = Object.assign({}, (init && init.headers) || {});
  const token = sessionStorage.getItem("weir-token");
  if (token) headers.Authorization = "Bearer " + token;
  try {
    return { resp: await fetch(path, Object.assign({}, init, { headers })), sent: token };
  } catch (e) {
    throw new ApiError("unreachable", "job manager unreachable at " + location.host + " (" + (e.message || e) + ")");
  }
}

// api fetches a REST path as JSON (init: fetch's, for state-changing
// requests). A 401 asks for the token once, as above.
async function api(path, init) {
  let { resp, sent } = await request(path, init);
  if (resp.status === 401) {
    const current = sessionStorage.getItem("weir-token");
    if (tokenPrompt) {
      if (await tokenPrompt) ({ resp } = await request(path, init));
    } else if (current && current !== sent) {
      ({ resp } = await request(path, init)); // a token was given since this request left
    } else if (!tokenProblem) {
      sessionStorage.removeItem("weir-token");
      if (await askToken(sent ? "The job manager refused the token." : "")) ({ resp } = await request(path, init));
    }
    if (resp.status === 401) {
      if (!tokenProblem) {
        sessionStorage.removeItem("weir-token");
        tokenProblem = "the job manager refused the token (HTTP 401): wrong token";
      }
      throw new ApiError("token", tokenProblem);
    }
  }
  if (!resp.ok) {
    let msg = "HTTP " + resp.status;
    try { msg += ": " + (await resp.json()).errors.join("; "); } catch (e) { /* not Flink's error body */ }
    throw new ApiError(resp.status === 404 ? "missing" : "http", path + ": " + msg);
  }
  return resp.json();
}

function enterToken() {
  tokenProblem = null;
  sessionStorage.removeItem("weir-token");
  askToken("").then(refresh);
}

// The graph's fonts (style.css's svg text rules) and a measure of a text's
// width in one of them.
const TITLE_FONT = "600 12px system-ui, sans-serif", TEXT_FONT = "12px system-ui, sans-serif", SMALL_FONT = "10px system-ui, sans-serif";
const measure = document.createElement("canvas").getContext("2d");
function textWidth(text, font) {
  measure.font = font;
  return measure.measureText(text).width;
}

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else if (k.startsWith("on")) e.addEventListener(k.slice(2), v); else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}

function svg(tag, attrs, text) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

function state(s) { return el("span", { class: "state " + s }, s); }

function duration(ms) {
  if (ms < 0) return "–";
  if (ms < 1000) return ms + " ms";
  const s = Math.floor(ms / 1000);
  if (s < 120) return (ms / 1000).toFixed(1) + " s";
  const m = Math.floor(s / 60);
  return m < 120 ? m + " min " + (s % 60) + " s" : Math.floor(m / 60) + " h " + (m % 60) + " min";
}

function bytes(n) {
  if (n < 1024) return n + " B";
  if (n < 1 << 20) return (n / 1024).toFixed(1) + " KiB";
  return (n / (1 << 20)).toFixed(1) + " MiB";
}

function perSecond(n) {
  if (n === undefined) return "–";
  if (n >= 1e6) return (n / 1e6).toFixed(2) + "M/s";
  if (n >= 1e3) return (n / 1e3).toFixed(1) + "k/s";
  return n.toFixed(0) + "/s";
}

function fill(tbody, rows, empty) {
  tbody.replaceChildren(...(rows.length ? rows : [el("tr", {}, el("td", { colspan: 9, class: "muted" }, empty))]));
}

function select(id) {
  selected = id;
  location.hash = "#/jobs/" + id;
  refresh();
}

function drawJobs(overview) {
  const jobs = overview.jobs.slice().sort((a, b) => b["start-time"] - a["start-time"]);
  if (!selected || !jobs.some(j => j.jid === selected)) {
    const fromHash = location.hash.match(/^#\/jobs\/([0-9a-f]+)/);
    const running = jobs.find(j => j.state === "RUNNING");
    selected = fromHash && jobs.some(j => j.jid === fromHash[1]) ? fromHash[1] : (running || jobs[0] || {}).jid || null;
  }
  fill(document.querySelector("#jobs tbody"), jobs.map(j =>
    el("tr", { class: "job" + (j.jid === selected ? " selected" : ""), "data-job": j.jid, onclick: () => select(j.jid) },
      el("td", {}, el("code", {}, j.jid)), el("td", {}, j.name), el("td", {}, state(j.state)),
      el("td", {}, j.restarts), el("td", { class: "duration" }, jobDuration(j)))), "no jobs yet: streamctl submit JOB");
}

// jobDuration says how long a job has been running, or, once it ended, how
// long it ran and when it ended.
function jobDuration(j) {
  if (!ENDED.includes(j.state)) return "running for " + duration(j.duration);
  const end = j["end-time"] > 0 ? ", ended " + new Date(j["end-time"]).toLocaleString() : "";
  return (j.duration >= 0 ? "ran " + duration(j.duration) : "ended") + end;
}

// drawTaskManagers lists the registered task managers, then the lost ones
// (until they register again), marked as such.
function drawTaskManagers(tms) {
  fill(document.querySelector("#taskmanagers tbody"), tms.map(t => t.state === "LOST" ?
    el("tr", { "data-taskmanager": t.id, class: "lost" }, el("td", {}, t.id), el("td", {}, state("LOST")), el("td", {}, t.slotsNumber),
      el("td", {}, "–"), el("td", {}, t.data_host),
      el("td", { class: "wrap" }, "lost at " + new Date(t.lost_at).toLocaleTimeString() + (t.lost_reason ? ": " + t.lost_reason : ""))) :
    el("tr", { "data-taskmanager": t.id }, el("td", {}, t.id), el("td", {}, state("REGISTERED")), el("td", {}, t.slotsNumber),
      el("td", {}, t.freeSlots), el("td", {}, t.data_host), el("td", {}, duration(t.heartbeat_age_ms) + " ago"))),
    "none registered: streamctl taskmanager");
}

// noteRate turns two samples of a vertex's or a task's counters into
// per-second rates; n is how many subtasks share the back-pressure time.
function noteRate(key, m, now, n) {
  const p = previous[key];
  if (p && now > p.at) {
    const dt = (now - p.at) / 1000;
    rates[key] = {
      read: Math.max(0, m["read-records"] - p.read) / dt,
      write: Math.max(0, m["write-records"] - p.write) / dt,
      // back-pressured ms per second of every subtask, as a share of the time
      bp: Math.min(1, Math.max(0, m["accumulated-backpressured-time"] - p.bp) / (dt * 1000 * n)),
    };
  }
  previous[key] = { at: now, read: m["read-records"], write: m["write-records"], bp: m["accumulated-backpressured-time"] };
}

function noteRates(job) {
  for (const v of job.vertices) {
    noteRate(v.id, v.metrics, job.now, v.parallelism);
    for (const s of v.subtasks || []) noteRate("task " + s.task_id, s.metrics, job.now, 1);
  }
}

function drawSubtasks(job) {
  const rows = [];
  for (const v of job.vertices) {
    for (const s of v.subtasks || []) {
      const r = rates["task " + s.task_id];
      rows.push(el("tr", { "data-task": s.task_id }, el("td", {}, el("code", {}, s.task_id)), el("td", {}, s["taskmanager-id"] || "–"),
        el("td", {}, state(s.status)), el("td", {}, s.metrics["read-records"]), el("td", {}, s.metrics["write-records"]),
        el("td", {}, perSecond(r && r.read)), el("td", {}, perSecond(r && r.write)),
        el("td", {}, r ? Math.round(r.bp * 100) + "%" : "–")));
    }
  }
  fill(document.querySelector("#subtasks tbody"), rows, "no tasks deployed");
}

// watermark describes a vertex's watermark (the least currentInputWatermark
// of its subtasks, epoch ms; absent until each has one) and how far it lags
// the job manager's clock now.
function watermark(wm, now) {
  if (wm === undefined || wm === null) return "watermark –";
  return `watermark ${new Date(wm).toISOString().slice(11, 23)} · lags ${duration(Math.max(0, now - wm))}`;
}

// lag describes a source vertex's backlog: Flink's pendingRecords summed
// over its subtasks, and records-lag-max, the backlog of its most lagging
// input partition; null for a vertex that reports none.
function lag(m) {
  const p = m.pendingRecords, l = m["records-lag-max"];
  if (p === undefined || p === null) return null;
  return `lag ${p} records` + (l === undefined || l === null ? "" : ` · ${l} in the most lagging partition`);
}

// drawGraph lays the vertices out left to right by depth (longest path from
// a source) and draws the plan's edges between them.
function drawGraph(job) {
  const inputs = {};
  for (const n of job.plan.nodes || []) inputs[n.id] = n.inputs || [];
  const depth = {};
  const depthOf = (id, seen = new Set()) => {
    if (depth[id] !== undefined) return depth[id];
    if (seen.has(id)) return 0;
    seen.add(id);
    const ins = inputs[id] || [];
    return (depth[id] = ins.length ? 1 + Math.max(...ins.map(i => depthOf(i.id, seen))) : 0);
  };
  const cols = [];
  for (const v of job.vertices) (cols[depthOf(v.id)] ||= []).push(v);
  // Each box's lines, measured, so the boxes are wide enough for them; a
  // source that reports its backlog has a fifth line, its lag.
  const lines = {};
  let widest = 0, lagLine = false;
  for (const v of job.vertices) {
    const r = rates[v.id];
    lines[v.id] = [
      [`${v.name} ×${v.parallelism}`, TITLE_FONT],
      [`${v.status} · in ${perSecond(r && r.read)} · out ${perSecond(r && r.write)}`, TEXT_FONT],
      [`back-pressured ${r ? Math.round(r.bp * 100) + "%" : "–"} · ${v.metrics["read-records"]} in, ${v.metrics["write-records"]} out`, SMALL_FONT],
      [watermark(v.currentInputWatermark, job.now), SMALL_FONT],
    ];
    const l = lag(v.metrics);
    if (l !== null) {
      lines[v.id].push([l, SMALL_FONT]);
      lagLine = true;
    }
    for (const [text, font] of lines[v.id]) widest = Math.max(widest, textWidth(text, font));
  }
  const W = Math.max(230, Math.ceil(widest) + 24), H = lagLine ? 110 : 92, GX = 70, GY = 24;
  const pos = {};
  cols.forEach((col, c) => col.forEach((v, r) => { pos[v.id] = { x: 10 + c * (W + GX), y: 10 + r * (H + GY) }; }));
  const width = 20 + cols.length * (W + GX) - GX, height = 20 + Math.max(1, ...cols.map(c => c.length)) * (H + GY) - GY;
  const g = svg("svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": "job graph" });
  const defs = svg("defs");
  const marker = svg("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 10, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto" });
  marker.append(svg("path", { d: "M0,0 L10,5 L0,10 z", fill: "#8b95a7" }));
  defs.append(marker);
  g.append(defs);
  for (const v of job.vertices) {
    for (const i of inputs[v.id] || []) {
      const a = pos[i.id], b = pos[v.id];
      if (!a || !b) continue;
      const x1 = a.x + W, y1 = a.y + H / 2, x2 = b.x, y2 = b.y + H / 2;
      g.append(svg("path", { class: "edge", d: `M${x1},${y1} C${x1 + GX / 2},${y1} ${x2 - GX / 2},${y2} ${x2},${y2}` }));
      g.append(svg("text", { class: "small", x: (x1 + x2) / 2 - 20, y: (y1 + y2) / 2 - 4 }, i.ship_strategy || ""));
    }
  }
  for (const v of job.vertices) {
    const p = pos[v.id], r = rates[v.id];
    const bp = r ? r.bp : 0;
    const box = svg("g", { class: "vertex" + (bp > 0.5 ? " bp" : ""), "data-vertex": v.name, transform: `translate(${p.x},${p.y})` });
    box.append(svg("rect", { width: W, height: H }));
    const [title, rate, totals, wm, lagged] = lines[v.id];
    box.append(svg("text", { x: 10, y: 20, class: "title" }, title[0]));
    box.append(svg("text", { x: 10, y: 38 }, rate[0]));
    box.append(svg("text", { x: 10, y: 56, class: "small" }, totals[0]));
    box.append(svg("text", { x: 10, y: 74, class: "small watermark" }, wm[0]));
    if (lagged) box.append(svg("text", { x: 10, y: 92, class: "small lag" }, lagged[0]));
    g.append(box);
  }
  document.getElementById("graph").replaceChildren(g);
}

// CHART_MINUTES is the span of the checkpoint chart; CHART_HISTORY how many
// checkpoints the page asks for (the job manager keeps at most 2000).
const CHART_MINUTES = 10, CHART_HISTORY = 2000, CHART_COLUMNS = 120;

// drawCheckpoints charts the checkpoints of the last CHART_MINUTES: time
// runs left to right in CHART_COLUMNS columns, each a bar for the longest
// checkpoint triggered in it (red if one failed; left axis), and a line for
// the state size (right axis). The table lists the newest 15.
function drawCheckpoints(cps) {
  const c = cps.counts;
  document.getElementById("cp-counts").textContent =
    `${c.completed} completed, ${c.failed} failed, ${c.in_progress} in progress` +
    (cps.latest.restored ? ` · restored from checkpoint ${cps.latest.restored.id}` : "");
  const now = Date.now();
  const hist = cps.history.filter(h => h.trigger_timestamp > 0).sort((a, b) => a.trigger_timestamp - b.trigger_timestamp);
  const from = Math.max(now - CHART_MINUTES * 60000, hist.length ? hist[0].trigger_timestamp : now);
  const span = Math.max(1000, now - from);
  const columns = [];
  for (const h of hist) {
    if (h.trigger_timestamp < from) continue;
    const i = Math.min(CHART_COLUMNS - 1, Math.floor((h.trigger_timestamp - from) / span * CHART_COLUMNS));
    const col = columns[i] ||= { n: 0, failed: false, duration: 0, size: null, first: h.id, last: h.id };
    col.n++;
    col.last = h.id;
    col.duration = Math.max(col.duration, h.end_to_end_duration);
    col.failed ||= h.status === "FAILED";
    if (h.status === "COMPLETED") col.size = h.state_size;
  }
  const W = 760, H = 160, L = 50, R = 60, T = 10, B = 24;
  const g = svg("svg", { width: W, height: H, viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "checkpoint durations and sizes" });
  const used = columns.filter(Boolean);
  if (used.length) {
    const maxD = Math.max(1, ...used.map(col => col.duration));
    const maxS = Math.max(1, ...used.filter(col => col.size !== null).map(col => col.size));
    const bw = (W - L - R) / CHART_COLUMNS;
    g.append(svg("line", { class: "axis", x1: L, y1: H - B, x2: W - R, y2: H - B }));
    g.append(svg("text", { class: "small", x: 2, y: T + 8 }, duration(maxD)));
    g.append(svg("text", { class: "small", x: W - R + 4, y: T + 8 }, bytes(maxS)));
    g.append(svg("text", { class: "small", x: L, y: H - 6 }, new Date(from).toLocaleTimeString()));
    g.append(svg("text", { class: "small", x: W - R - 60, y: H - 6 }, new Date(now).toLocaleTimeString()));
    let line = "";
    columns.forEach((col, i) => {
      if (!col) return;
      const bh = Math.max(1, (H - T - B) * col.duration / maxD);
      const status = col.failed ? "FAILED" : "COMPLETED";
      const bar = svg("rect", { class: "bar " + status, x: L + i * bw, y: H - B - bh, width: Math.max(1, bw - 1), height: bh });
      bar.append(svg("title", {}, `checkpoints ${col.first}–${col.last} (${col.n}): longest ${duration(col.duration)}` +
        (col.size !== null ? `, ${bytes(col.size)}` : "") + (col.failed ? ", one failed" : "")));
      g.append(bar);
      if (col.size !== null) {
        const y = H - B - (H - T - B) * col.size / maxS;
        line += (line ? " L" : "M") + (L + i * bw + bw / 2).toFixed(1) + "," + y.toFixed(1);
      }
    });
    if (line) g.append(svg("path", { class: "size", d: line }));
  }
  document.getElementById("cp-span").textContent = used.length ?
    `· charted: the last ${duration(span)}, ${hist.filter(h => h.trigger_timestamp >= from).length} checkpoints` : "";
  document.getElementById("cp-chart").replaceChildren(g);
  const rows = cps.history.slice().sort((a, b) => b.id - a.id).slice(0, 15).map(h =>
    el("tr", { "data-checkpoint": h.id }, el("td", {}, h.id), el("td", {}, state(h.status)),
      el("td", {}, new Date(h.trigger_timestamp).toLocaleTimeString()), el("td", {}, duration(h.end_to_end_duration)),
      el("td", {}, `${h.num_acknowledged_subtasks}/${h.num_subtasks}`),
      el("td", {}, h.status === "COMPLETED" ? bytes(h.state_size) : "–"), el("td", {}, duration(h.alignment_duration || 0)),
      el("td", { class: "wrap" }, h.failure_message || "")));
  fill(document.querySelector("#checkpoints tbody"), rows, "no checkpoint yet");
}

// drawCheckpointSubtasks lists the subtasks of the latest completed
// checkpoint (GET .../checkpoints/details/{cid}/subtasks/{vid} of every
// vertex, in graph order) with their sync and async snapshot durations.
function drawCheckpointSubtasks(cid, vertices) {
  document.getElementById("cp-subtasks-id").textContent = cid ? ` (${cid})` : "";
  const rows = [];
  for (const { v, details } of vertices) {
    for (const s of details.subtasks) {
      const task = `${v.id}#${s.index}`;
      if (s.status !== "completed") {
        rows.push(el("tr", { "data-cp-task": task }, el("td", {}, task), el("td", { colspan: 6, class: "muted" }, "not acknowledged")));
        continue;
      }
      rows.push(el("tr", { "data-cp-task": task }, el("td", {}, task), el("td", {}, duration(s.end_to_end_duration)),
        el("td", {}, duration(s.checkpoint.sync)), el("td", {}, duration(s.checkpoint.async)), el("td", {}, duration(s.alignment.duration)),
        el("td", {}, bytes(s.state_size)), el("td", {}, bytes(s.checkpointed_size))));
    }
  }
  fill(document.querySelector("#cp-subtasks tbody"), rows, cid ? "checkpoint no longer in the recent history" : "no completed checkpoint yet");
}

// checkpointSubtasks fetches the per-subtask statistics of checkpoint cid
// for every vertex of job (none without cid, or once cid left the history).
async function checkpointSubtasks(id, cid, job) {
  if (!cid) return [];
  try {
    return await Promise.all(job.vertices.map(async v =>
      ({ v, details: await api(`/jobs/${id}/checkpoints/details/${cid}/subtasks/${encodeURIComponent(v.id)}`) })));
  } catch (e) {
    if (e.kind === "missing") return [];
    throw e;
  }
}

// drawSavepoints lists the savepoints taken of the job (GET
// /jobs/{id}/savepoints), newest first: path, checkpoint, time, status.
function drawSavepoints(sps) {
  const rows = (sps ? sps.savepoints : []).slice().reverse().map(sp =>
    el("tr", {}, el("td", { class: "wrap" }, sp.location || (sp.failure ? "failed: " + sp.failure : "…")),
      el("td", {}, sp.checkpoint || "–"), el("td", {}, new Date(sp.triggered_unix_ms).toLocaleTimeString()),
      el("td", {}, sp.status === "COMPLETED" ? (sp.failure ? "FAILED" : (sp.stop ? "COMPLETED (stop)" : "COMPLETED")) : sp.status)));
  fill(document.querySelector("#savepoints tbody"), rows, "no savepoint taken here");
}

// failureWhere says where a failure of the exception history happened: in
// which task on which task manager (each named once).
function failureWhere(e) {
  const tm = e.taskManagerId || e.location || e.endpoint;
  return (e.taskName ? " in " + e.taskName : "") + (tm ? " on " + tm : "");
}

// drawFailure shows the job's last failure (GET /jobs/{id}/exceptions,
// Flink's exception history) and, collapsed, the whole history, newest
// first; or hides them when there is none (or the job manager does not
// serve the route). The history is redrawn only when it changed, so that
// an entry the user opened stays open across refreshes.
let shownHistory = null; // the exception history drawn, as drawFailure compares it
function drawFailure(exc) {
  const box = document.getElementById("job-failure");
  const entries = (exc && exc.exceptionHistory && exc.exceptionHistory.entries) || [];
  const last = entries[0];
  if (!last && !(exc && exc["root-exception"])) {
    box.hidden = true;
    document.getElementById("job-exceptions").hidden = true;
    return;
  }
  box.hidden = false;
  const when = (last ? last.timestamp : exc.timestamp) || 0;
  document.getElementById("job-failure-head").textContent =
    `last failure${when ? " at " + new Date(when).toLocaleString() : ""}${last ? failureWhere(last) : ""}`;
  document.getElementById("job-failure-text").textContent = (last ? (last.stacktrace || last.exceptionName) : exc["root-exception"]) || "";
  const history = document.getElementById("job-exceptions");
  const truncated = exc.exceptionHistory && exc.exceptionHistory.truncated;
  const sig = entries.map(e => e.timestamp + " " + e.exceptionName).join("\n") + (truncated ? " +" : "");
  history.hidden = entries.length === 0;
  if (shownHistory === sig) return;
  shownHistory = sig;
  document.getElementById("job-exceptions-count").textContent =
    `exception history: ${entries.length} failure${entries.length === 1 ? "" : "s"}${truncated ? " (older ones dropped)" : ""}`;
  document.getElementById("job-exceptions-list").replaceChildren(...entries.map(e =>
    el("li", { "data-exception": e.timestamp }, el("details", {},
      el("summary", {}, new Date(e.timestamp).toLocaleString() + failureWhere(e) + ": " + e.exceptionName),
      el("pre", {}, e.stacktrace || "")))));
}

const ENDED = ["FINISHED", "FAILED", "CANCELED"];

// cancelJob asks the job manager to cancel the selected job (Flink's PATCH
// /jobs/{id}?mode=cancel). The request carries a JSON body and its
// Content-Type, so it is never a "simple" cross-site request.
async function cancelJob() {
  const id = selected;
  if (!id || !window.confirm("Cancel job " + id + "? Its tasks stop, open transactions are aborted.")) return;
  const button = document.getElementById("cancel");
  button.disabled = true;
  button.textContent = "cancelling…";
  try {
    await api("/jobs/" + id + "?mode=cancel", { method: "PATCH", headers: { "Content-Type": "application/json" }, body: "{}" });
  } catch (e) {
    showProblem(e);
  }
  refresh();
}

function drawJob(job, cps, exc) {
  document.getElementById("job").hidden = false;
  document.getElementById("job-name").textContent = job.name;
  document.getElementById("job-id").textContent = job.jid;
  document.getElementById("job-state").replaceWith(Object.assign(state(job.state), { id: "job-state" }));
  const button = document.getElementById("cancel");
  const ended = ENDED.includes(job.state);
  button.hidden = ended;
  if (ended || button.dataset.job !== job.jid) {
    button.disabled = false;
    button.textContent = "Cancel job";
    button.dataset.job = job.jid;
  }
  const facts = [[ended ? "ran for" : "running for", duration(job.duration)]];
  if (ended && job["end-time"] > 0) facts.push(["ended at", new Date(job["end-time"]).toLocaleString()]);
  if (job.next_attempt_at) {
    const left = job.next_attempt_at - job.now;
    facts.push(["next attempt", new Date(job.next_attempt_at).toLocaleString() + (left > 0 ? " (in " + duration(left) + ")" : "")]);
  }
  if (job.waiting) facts.push(["waiting", job.waiting]);
  facts.push(["restarts", job.restarts],
    [ended ? "records in / out (last attempt)" : "records in / out (this attempt)", `${job.records_in} / ${job.records_out}`],
    ["last completed checkpoint", job.last_completed_checkpoint || "none"],
    ["restored from checkpoint", job.restored_from_checkpoint || "none"],
    ["checkpoint interval", duration(job.checkpoint_interval_ms)],
    ["restart strategy", job.restart_strategy || "default"]);
  if (job.error) facts.push(["error", job.error]);
  document.getElementById("job-facts").replaceChildren(...facts.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
  noteRates(job);
  drawGraph(job);
  drawSubtasks(job);
  drawCheckpoints(cps);
  drawFailure(exc);
}

// showProblem says in the header why the page cannot show the job
// manager's state; a token problem offers to enter the token again.
function showProblem(e) {
  const problem = document.getElementById("problem");
  problem.hidden = false;
  problem.replaceChildren(String(e.message || e));
  if (e.kind === "token") problem.append(" ", el("button", { id: "enter-token", onclick: enterToken }, "enter token"));
  document.getElementById("updated").textContent = e.kind === "unreachable" ? "unreachable" : "not updated";
}

let loaded = false; // the tables hold the job manager's data

async function refresh() {
  try {
    const [overview, tms] = await Promise.all([api("/jobs/overview"), api("/taskmanagers")]);
    drawJobs(overview);
    drawTaskManagers(tms.taskmanagers);
    loaded = true;
    if (selected) {
      const id = selected;
      const [job, cps, exc, sps] = await Promise.all([api("/jobs/" + id), api("/jobs/" + id + "/checkpoints?history=" + CHART_HISTORY),
        api("/jobs/" + id + "/exceptions").catch(e => { if (e.kind === "missing") return null; throw e; }),
        api("/jobs/" + id + "/savepoints").catch(e => { if (e.kind === "missing") return null; throw e; })]);
      const cid = cps.latest.completed ? cps.latest.completed.id : 0;
      const cpTasks = await checkpointSubtasks(id, cid, job);
      if (id === selected) {
        drawJob(job, cps, exc);
        drawSavepoints(sps);
        drawCheckpointSubtasks(cid, cpTasks);
      }
    } else {
      document.getElementById("job").hidden = true;
    }
    document.getElementById("problem").hidden = true;
    document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
  } catch (e) {
    showProblem(e);
    // A table that shows no rows says why, not "no jobs yet".
    const why = e.kind === "token" ? "token needed (see above)" : e.kind === "unreachable" ? "job manager unreachable" : "cannot load";
    for (const sel of ["#jobs tbody", "#taskmanagers tbody"]) {
      const body = document.querySelector(sel);
      if (!loaded || body.querySelector("td[colspan]")) fill(body, [], why);
    }
  }
}

document.getElementById("cancel").addEventListener("click", cancelJob);
refresh();
setInterval(refresh, REFRESH_MS);
