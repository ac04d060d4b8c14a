// Weir dashboard: reads the job manager's REST API and redraws every
// REFRESH_MS. Plain DOM, no dependencies; every value comes from the API.
"use strict";

const REFRESH_MS = 2000;
const SVG = "http://www.w3.org/2000/svg";
let selected = null;      // job id shown in the job section
const previous = {};      // vertex id -> {at, read, write, bp}: for per-second rates
const rates = {};         // vertex id -> {read, write, bp}

// api fetches a REST path as JSON. A 401 asks for the job manager's token
// once and keeps it for the tab (sessionStorage).
async function api(path) {
  const headers = {};
  const token = sessionStorage.getItem("weir-token");
  if (token) headers.Authorization = "Bearer " + token;
  const resp = await fetch(path, { headers });
  if (resp.status === 401) {
    const t = window.prompt("The job manager requires its token (--auth-token-file):");
    if (t) { sessionStorage.setItem("weir-token", t.trim()); return api(path); }
  }
  if (!resp.ok) throw new Error(path + ": HTTP " + resp.status);
  return resp.json();
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
      el("td", {}, j.restarts), el("td", {}, duration(j.duration)))), "no jobs yet: streamctl submit JOB");
}

function drawTaskManagers(tms) {
  fill(document.querySelector("#taskmanagers tbody"), tms.map(t =>
    el("tr", { "data-taskmanager": t.id }, el("td", {}, t.id), el("td", {}, t.slots), el("td", {}, t.free_slots),
      el("td", {}, t.data_host), el("td", {}, duration(t.heartbeat_age_ms) + " ago"))), "none registered: streamctl taskmanager");
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
      rows.push(el("tr", { "data-task": s.task_id }, el("td", {}, el("code", {}, s.task_id)), el("td", {}, s.taskmanager_id || "–"),
        el("td", {}, state(s.status)), el("td", {}, s.metrics["read-records"]), el("td", {}, s.metrics["write-records"]),
        el("td", {}, perSecond(r && r.read)), el("td", {}, perSecond(r && r.write)),
        el("td", {}, r ? Math.round(r.bp * 100) + "%" : "–")));
    }
  }
  fill(document.querySelector("#subtasks tbody"), rows, "no tasks deployed");
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
  const W = 230, H = 74, GX = 70, GY = 24;
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
    box.append(svg("text", { x: 10, y: 20, "font-weight": 600 }, `${v.name} ×${v.parallelism}`));
    box.append(svg("text", { x: 10, y: 38 }, `${v.status} · in ${perSecond(r && r.read)} · out ${perSecond(r && r.write)}`));
    box.append(svg("text", { x: 10, y: 56, class: "small" },
      `back-pressured ${r ? Math.round(bp * 100) + "%" : "–"} · ${v.metrics["read-records"]} in, ${v.metrics["write-records"]} out`));
    g.append(box);
  }
  document.getElementById("graph").replaceChildren(g);
}

// drawCheckpoints charts the last 60 checkpoints: a bar per checkpoint for
// its duration (left axis), a line for the state size (right axis).
function drawCheckpoints(cps) {
  const c = cps.counts;
  document.getElementById("cp-counts").textContent =
    `${c.completed} completed, ${c.failed} failed, ${c.in_progress} in progress` +
    (cps.latest.restored ? ` · restored from checkpoint ${cps.latest.restored.id}` : "");
  const hist = cps.history.slice().sort((a, b) => a.id - b.id).slice(-60);
  const W = 760, H = 160, L = 50, R = 60, T = 10, B = 24;
  const g = svg("svg", { width: W, height: H, viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "checkpoint durations and sizes" });
  if (hist.length) {
    const maxD = Math.max(1, ...hist.map(h => h.end_to_end_duration));
    const maxS = Math.max(1, ...hist.map(h => h.state_size));
    const bw = (W - L - R) / hist.length;
    g.append(svg("line", { class: "axis", x1: L, y1: H - B, x2: W - R, y2: H - B }));
    g.append(svg("text", { class: "small", x: 2, y: T + 8 }, duration(maxD)));
    g.append(svg("text", { class: "small", x: W - R + 4, y: T + 8 }, bytes(maxS)));
    g.append(svg("text", { class: "small", x: L, y: H - 6 }, "checkpoint " + hist[0].id));
    g.append(svg("text", { class: "small", x: W - R - 80, y: H - 6 }, "checkpoint " + hist[hist.length - 1].id));
    let line = "";
    hist.forEach((h, i) => {
      const bh = (H - T - B) * h.end_to_end_duration / maxD;
      const bar = svg("rect", { class: "bar " + h.status, x: L + i * bw + 1, y: H - B - bh, width: Math.max(1, bw - 2), height: bh });
      bar.append(svg("title", {}, `checkpoint ${h.id}: ${h.status}, ${duration(h.end_to_end_duration)}, ${bytes(h.state_size)}`));
      g.append(bar);
      if (h.status === "COMPLETED") {
        const y = H - B - (H - T - B) * h.state_size / maxS;
        line += (line ? " L" : "M") + (L + i * bw + bw / 2).toFixed(1) + "," + y.toFixed(1);
      }
    });
    if (line) g.append(svg("path", { class: "size", d: line }));
  }
  document.getElementById("cp-chart").replaceChildren(g);
  const rows = cps.history.slice().sort((a, b) => b.id - a.id).slice(0, 15).map(h =>
    el("tr", { "data-checkpoint": h.id }, el("td", {}, h.id), el("td", {}, state(h.status)),
      el("td", {}, new Date(h.trigger_timestamp).toLocaleTimeString()), el("td", {}, duration(h.end_to_end_duration)),
      el("td", {}, h.status === "COMPLETED" ? bytes(h.state_size) : "–"), el("td", { class: "wrap" }, h.failure_message || "")));
  fill(document.querySelector("#checkpoints tbody"), rows, "no checkpoint yet");
}

function drawJob(job, cps) {
  document.getElementById("job").hidden = false;
  document.getElementById("job-name").textContent = job.name;
  document.getElementById("job-id").textContent = job.jid;
  document.getElementById("job-state").replaceWith(Object.assign(state(job.state), { id: "job-state" }));
  const facts = [
    ["running for", duration(job.duration)], ["restarts", job.restarts],
    ["records in / out (this attempt)", `${job.records_in} / ${job.records_out}`],
    ["last completed checkpoint", job.last_completed_checkpoint || "none"],
    ["restored from checkpoint", job.restored_from_checkpoint || "none"],
    ["checkpoint interval", duration(job.checkpoint_interval_ms)],
    ["restart strategy", job.restart_strategy || "default"],
  ];
  if (job.error) facts.push(["error", job.error]);
  document.getElementById("job-facts").replaceChildren(...facts.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
  noteRates(job);
  drawGraph(job);
  drawSubtasks(job);
  drawCheckpoints(cps);
}

async function refresh() {
  const problem = document.getElementById("problem");
  try {
    const [overview, tms] = await Promise.all([api("/jobs/overview"), api("/taskmanagers")]);
    drawJobs(overview);
    drawTaskManagers(tms);
    if (selected) {
      const [job, cps] = await Promise.all([api("/jobs/" + selected), api("/jobs/" + selected + "/checkpoints")]);
      drawJob(job, cps);
    } else {
      document.getElementById("job").hidden = true;
    }
    problem.hidden = true;
    document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
  } catch (e) {
    problem.hidden = false;
    problem.textContent = String(e.message || e);
  }
}

refresh();
setInterval(refresh, REFRESH_MS);
