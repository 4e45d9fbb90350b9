// Atoll dashboard: polls the head's read endpoints (/ui/api/*) with the dashboard token and
// draws the cluster map, the gangs, the plots (Chart.js) and the events.
"use strict";

const POLL_MS = 1000;
const WINDOW_MS = 15 * 60 * 1000; // plots keep the last 15 minutes
const MIN_SPAN_MS = 30 * 1000;     // ... and show at least 30 seconds
const MAX_EVENTS = 1000;
const PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7",
  "#9c755f", "#2f4b7c", "#a05195", "#d45087", "#665191", "#00a0b0", "#6a4c93", "#8ac926"];

const ui = {
  token: "",
  state: null,
  selected: "",       // the highlighted gang (job/gang)
  lastT: 0,           // newest sample time
  lastSeq: 0,         // newest event
  events: [],
  progressT: {},      // gang -> newest progress time (ms)
  runs: {},           // gang -> {uid: {n, start, gen}}: the runs of a gang name, numbered in order of first sight
  firstT: 0,          // oldest sample or report shown (ms, the head's clock)
  charts: {},
  jobs: new Set(),
  errors: 0,          // the page's own failures (a section that could not be drawn)
};

function $(id) { return document.getElementById(id); }

// list is x when it is an array, else [] (an absent or null section draws as empty).
function list(x) { return Array.isArray(x) ? x : []; }
function num(x) { return typeof x === "number" && isFinite(x) ? x : 0; }

// pageError records a failure of the page itself (not of the head's answer): it is shown
// in the header and marked on the body (data-error) for the browser test.
function pageError(what) {
  ui.errors++;
  document.body.dataset.error = what;
  const l = $("live");
  if (l) { l.textContent = "page error: " + what; l.classList.add("stale"); }
}
window.addEventListener("error", e => pageError(e.message || String(e)));
window.addEventListener("unhandledrejection", e => pageError(e.reason && e.reason.message ? e.reason.message : String(e.reason)));

// section draws one part of the page; a part that fails does not stop the others.
function section(name, fn) {
  try { fn(); } catch (err) { pageError(name + ": " + (err && err.message ? err.message : String(err))); }
}

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (v !== undefined && v !== null) e.setAttribute(k, v);
  }
  for (const k of kids) if (k !== null && k !== undefined) e.append(k);
  return e;
}

// colorOf gives each gang (or series) a colour of its own, kept for the page's life: the
// palette in order of first sight, then a hue from the name's hash.
const colors = new Map();
function colorOf(key) {
  let c = colors.get(key);
  if (!c) {
    if (colors.size < PALETTE.length) c = PALETTE[colors.size];
    else {
      let h = 2166136261;
      for (let i = 0; i < key.length; i++) h = Math.imul(h ^ key.charCodeAt(i), 16777619) >>> 0;
      c = "hsl(" + (h % 360) + ",55%,50%)";
    }
    colors.set(key, c);
  }
  return c;
}

// The token comes in the URL (?token=...) the first time and is then kept in this tab's
// session storage, out of the address bar.
function takeToken() {
  const u = new URL(window.location.href);
  const t = u.searchParams.get("token");
  if (t) {
    sessionStorage.setItem("atoll-dashboard-token", t);
    u.searchParams.delete("token");
    history.replaceState(null, "", u.pathname + (u.search ? u.search : "") + u.hash);
    return t;
  }
  return sessionStorage.getItem("atoll-dashboard-token") || "";
}

function refuse(why) {
  $("app").hidden = true;
  $("auth").hidden = false;
  if (why) $("auth-why").textContent = why;
  document.body.dataset.auth = "refused";
}

class AuthError extends Error {}

async function get(path) {
  const r = await fetch(path, { headers: { Authorization: "Bearer " + ui.token }, cache: "no-store" });
  if (r.status === 401) throw new AuthError("the head refused this dashboard token");
  if (!r.ok) throw new Error(path + ": " + r.status + " " + (await r.text()));
  return r.json();
}

function fmtBytes(n) {
  if (!n || !isFinite(n)) return "0 B";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return n.toFixed(i ? 1 : 0) + " " + u[i];
}
function pct(v) { return v === undefined || v === null ? "–" : (100 * v).toFixed(0) + "%"; }
function clock(ms) { return new Date(ms).toLocaleTimeString([], { hour12: false }); }

// fmtMs writes a duration given in milliseconds in the unit that suits it.
function fmtMs(ms) {
  if (ms === null || ms === undefined || !isFinite(ms)) return "–";
  const p = v => String(Number(v.toPrecision(3)));
  if (ms < 1) return p(ms * 1000) + " µs";
  if (ms < 1000) return p(ms) + " ms";
  if (ms < 60000) return p(ms / 1000) + " s";
  return p(ms / 60000) + " min";
}
function fmtNum(v) {
  if (v === null || v === undefined || !isFinite(v)) return "–";
  const a = Math.abs(v);
  if (a !== 0 && (a < 0.01 || a >= 1e5)) return v.toExponential(2);
  return Number(v.toPrecision(4)).toString();
}

// ---- tiles -------------------------------------------------------------------------

function renderTiles(st) {
  const t = st.totals || {};
  const tiles = [
    ["GPUs", num(t.gpus), "gpus-total"],
    ["allocated", num(t.allocated) + (t.shared ? " (" + t.shared + " shared)" : ""), "gpus-allocated"],
    ["free", num(t.free), "gpus-free"],
    ["machines alive", num(t.machines_alive) + " / " + num(t.machines), "machines"],
    ["gangs running", num(t.running) + num(t.starting) + num(t.restarting), "gangs-running"],
    ["gangs pending", num(t.pending), "gangs-pending"],
    ["GPU use (agents)", pct(t.util_reported), "util"],
    ["object store", fmtBytes(t.store_hot_bytes) + " shm", "store"],
  ];
  const box = $("tiles");
  box.replaceChildren(...tiles.map(([k, v, id]) => el("div", { class: "tile", "data-tile": id },
    el("div", { class: "v", text: String(v) }), el("div", { class: "k", text: k }))));
}

// ---- the map -----------------------------------------------------------------------

function renderMap(st) {
  const live = list(st.gangs).filter(g => g.gpus > 0);
  $("legend").replaceChildren(
    el("span", { class: "chip", "data-gang": "" }, el("span", { class: "sw free-sw" }), "free"),
    ...live.map(g => {
      const sw = el("span", { class: "sw" });
      sw.style.background = colorOf(g.key);
      return el("span", { class: "chip" + (ui.selected === g.key ? " sel" : ""), "data-gang": g.key, onclick: () => select(g.key) }, sw, g.key);
    }));
  const free = $("legend").querySelector(".free-sw");
  if (free) free.style.background = "var(--free)";
  const racks = list(st.racks).map(r => el("div", { class: "rack", "data-rack": r.rack },
    el("div", { class: "title", text: "rack " + r.rack }),
    el("div", { class: "machines" }, ...list(r.machines).map(machineBox))));
  if (!racks.length) racks.push(el("div", { class: "muted empty", text: "no machine has registered yet" }));
  $("map").replaceChildren(...racks);
}

function machineBox(m) {
  const kind = m.simulated ? "simulated" : "real";
  const load = m.load ? " · cpu " + pct(m.load.cpu) + " · mem " + pct(m.load.mem) : "";
  const box = el("div", { class: "machine" + (m.alive ? "" : " dead"), "data-machine": m.name,
    title: m.alive ? "" : "dead: " + (m.reason || "") },
  el("div", { class: "name", text: m.name + (m.alive ? "" : " (dead)") }),
  el("div", { class: "meta", text: (m.model || m.type || "") + " · " + num(m.free) + "/" + num(m.gpus) + " free · " + kind + load }));
  const isl = el("div", { class: "islands" });
  for (const is of list(m.islands)) {
    const grid = el("div", { class: "island", title: is.id >= 0 ? "NVLink island " + is.id : "no NVLink island", "data-island": is.id });
    for (const g of list(is.gpus)) grid.append(gpuCell(m, g, is.id));
    isl.append(grid);
  }
  box.append(isl);
  return box;
}

function gpuCell(m, g, island) {
  const holders = list(g.holders);
  const gang = holders.length ? holders[0].gang : "";
  const tip = [m.name + " GPU " + g.index + (g.model ? " · " + g.model : ""), island >= 0 ? "island " + island : "",
    ...holders.map(h => h.gang + " rank " + h.rank + (h.milli ? " (" + h.milli / 10 + "% share)" : "") + (h.mig ? " (MIG " + h.mig + ")" : "")),
    holders.length ? "" : (m.alive ? "free" : "machine dead")].filter(Boolean).join("\n");
  const c = el("div", { class: "gpu", "data-gang": gang, "data-machine": m.name, "data-index": g.index, title: tip,
    onclick: () => gang && select(gang) });
  if (holders.length === 1 && !holders[0].milli) {
    c.style.background = colorOf(gang);
  } else if (holders.length) { // a shared card: one stripe per holder
    const step = 100 / holders.length;
    c.style.background = "linear-gradient(90deg," + holders.map((h, i) =>
      colorOf(h.gang) + " " + (i * step) + "%," + colorOf(h.gang) + " " + ((i + 1) * step) + "%").join(",") + ")";
  }
  if (list(g.mig).length) c.append(el("span", { class: "mig", text: "M" + g.mig.length }));
  if (ui.selected && gang !== ui.selected) c.classList.add("dim");
  return c;
}

function select(key) {
  ui.selected = ui.selected === key ? "" : key;
  if (ui.state) render(ui.state);
}

function renderDetail(st) {
  const d = $("detail");
  const g = list(st.gangs).find(x => x.key === ui.selected);
  if (!g) { d.hidden = true; return; }
  d.hidden = false;
  const p = g.placement || {};
  const sc = p.scores || {};
  const rows = [
    ["gang", g.key + " (" + g.state + ", generation " + g.generation + ")"],
    ["workers", g.ready + " ready of " + g.workers + " · " + g.gpus + " GPUs · queue " + g.queue],
    ["placement", list(p.machines).join(", ") + " · " + (p.islands || 0) + " island(s)"],
    ["scores", ["topology", "fragmentation", "load", "binpack", "total"].filter(k => typeof sc[k] === "number").map(k => k + " " + sc[k].toFixed(2)).join(" · ")],
    ["modeled AllReduce", typeof sc.allreduce_us === "number" ? sc.allreduce_us.toFixed(0) + " µs (machines crossed " + (sc.machines_crossed || 0) + ", racks " + (sc.racks_crossed || 0) + ")" : "–"],
    ["restarts", String(g.restarts) + (g.reason ? " · " + g.reason : "")],
    ["checkpoints", g.checkpoints ? g.checkpoints + " kept, newest step " + g.last_checkpoint : "none"],
  ];
  const members = list(p.members).map((m, r) => m.removed ? null : "rank " + r + " → " + m.machine + " GPU " + list(m.gpus).join(",") +
    (list(m.islands).length ? " (island " + m.islands.join(",") + ")" : "")).filter(Boolean).join("; ");
  rows.push(["members", members]);
  d.replaceChildren(el("table", {}, ...rows.map(([k, v]) => el("tr", {}, el("td", { class: "muted", text: k }), el("td", { text: v })))));
}

// ---- tables ------------------------------------------------------------------------

function emptyRow(cols, text) {
  return el("tr", { class: "empty" }, el("td", { class: "muted", colspan: String(cols), text }));
}

function renderGangs(st) {
  const body = $("gangs").tBodies[0];
  const gangs = list(st.gangs);
  body.replaceChildren(...gangs.map(g => {
    const sw = el("span", { class: "sw" });
    sw.style.background = g.gpus > 0 ? colorOf(g.key) : "transparent";
    let prog = "–";
    if (g.progress) {
      const ms = Object.entries(g.progress.metrics || {}).map(([k, v]) => k + " " + Number(v).toPrecision(4));
      prog = "step " + g.progress.step + (ms.length ? " · " + ms.join(" · ") : "");
    }
    return el("tr", { class: "clickable" + (ui.selected === g.key ? " sel" : ""), "data-gang": g.key, "data-state": g.state, onclick: () => select(g.key) },
      el("td", {}, sw, " ", g.key),
      el("td", {}, el("span", { class: "state " + g.state, text: g.state })),
      el("td", { text: g.queue + (g.priority ? " (prio " + g.priority + ")" : "") }),
      el("td", { text: num(g.ready) + "/" + num(g.workers) }),
      el("td", { text: String(num(g.gpus)) }),
      el("td", { text: String(num(g.generation)) }),
      el("td", { text: String(num(g.restarts)) }),
      el("td", { text: g.checkpoints ? "step " + g.last_checkpoint + " (" + g.checkpoints + ")" : "–" }),
      el("td", { text: prog }),
      el("td", { class: "muted", text: g.reason || "" }));
  }));
  if (!gangs.length) body.append(emptyRow(10, "no gang yet: atoll demo, or a program of yours, submits one"));
  const queues = list(st.queues);
  $("queues").tBodies[0].replaceChildren(...queues.map(q => el("tr", { "data-queue": q.name },
    el("td", { text: q.name }), el("td", { text: q.weight ? fmtNum(q.weight) : "–" }),
    el("td", { text: q.quota_gpus ? String(q.quota_gpus) : "–" }),
    el("td", { text: String(num(q.pending)) }), el("td", { text: String(num(q.running)) }),
    el("td", { text: String(num(q.gpus)) }),
    el("td", { text: typeof q.share === "number" ? q.share.toFixed(2) : "–", title: "use over fair share (1.00: its share; above: borrowing idle capacity)" }),
    el("td", { text: String(num(q.max_priority)) }))));
  if (!queues.length) $("queues").tBodies[0].append(emptyRow(8, "no queue"));
  const svcs = list(st.services);
  $("services").tBodies[0].replaceChildren(...svcs.map(s => el("tr", { "data-service": s.job + "/" + s.name },
    el("td", { text: s.job + "/" + s.name }), el("td", { text: String(num(s.replicas)) }),
    el("td", { text: num(s.min_replicas) + "–" + num(s.max_replicas) }), el("td", { text: String(num(s.gpus)) }),
    el("td", { text: String(num(s.scale_ups)) }), el("td", { text: String(num(s.scale_downs)) }),
    el("td", { class: "muted", text: s.reason || "" }))));
  if (!svcs.length) $("services").tBodies[0].append(emptyRow(7, "no service (Job.SpawnService starts one)"));
  for (const j of list(st.jobs)) ui.jobs.add(j.name);
  const sel = $("job-filter");
  const have = new Set([...sel.options].map(o => o.value));
  for (const j of [...ui.jobs].sort()) if (!have.has(j)) sel.append(el("option", { value: j, text: j }));
}

function renderWhere(st) {
  const heads = list(st.heads).length;
  $("where").textContent = "leader head " + st.leader + " · served by head " + st.served_by +
    (st.leading ? "" : " (a follower's view: the leader does not answer)") + " · revision " + st.revision + (heads ? " · " + heads + " heads" : "");
  if (ui.errors) return; // the page's own error stays shown
  const l = $("live");
  const t = Date.parse(st.time);
  l.textContent = "updated " + (isFinite(t) ? clock(t) : "now");
  l.classList.remove("stale");
}

function render(st) {
  section("header", () => renderWhere(st));
  section("totals", () => renderTiles(st));
  section("cluster map", () => renderMap(st));
  section("gang detail", () => renderDetail(st));
  section("tables", () => renderGangs(st));
}

// ---- plots -------------------------------------------------------------------------
//
// Every point is {x, y, v}: v is the value (null: none in that second), y what is drawn.
// A linear axis whose largest value is far above the rest is clipped (a single 200 s wait
// must not flatten every other point): y is capped, the clipped points are drawn as
// triangles at the top, and the plot's caption gives the true maximum. The x axis is the
// heads' clock, from the oldest point kept (at most WINDOW_MS) to the newest sample.

const ROBUST_MIN_POINTS = 8;   // fewer points than this: no clipping
const ROBUST_OUTLIERS = 0.02;  // at most this share of the points (and at least one) may be clipped
const ROBUST_FACTOR = 4;       // ... when they are above this many times the largest of the others

function isolated(ctx) {
  const d = ctx.dataset.data, i = ctx.dataIndex;
  const prev = i > 0 ? d[i - 1].y : null, next = i + 1 < d.length ? d[i + 1].y : null;
  return (prev === null || prev === undefined) && (next === null || next === undefined);
}

// The plugin that writes a message on a plot with nothing to draw.
const emptyNote = {
  id: "emptyNote",
  afterDraw(chart) {
    const any = chart.data.datasets.some(ds => ds.data.some(p => p.y !== null && p.y !== undefined));
    chart.canvas.dataset.points = String(chart.data.datasets.reduce((n, ds) => n + ds.data.filter(p => p.y !== null && p.y !== undefined).length, 0));
    if (any) return;
    const a = chart.chartArea, c = chart.ctx;
    c.save();
    c.fillStyle = "#6b7385";
    c.font = "12px system-ui, sans-serif";
    c.textAlign = "center";
    c.fillText(chart.options.plugins.emptyNote.text || "nothing yet", (a.left + a.right) / 2, (a.top + a.bottom) / 2);
    c.restore();
  },
};

function lineChart(id, datasets, opts) {
  opts = opts || {};
  const ctx = $(id);
  const chart = new Chart(ctx, {
    type: "line",
    data: { datasets: datasets.map(([label, color]) => dataset(label, color, opts.dash)) },
    options: {
      animation: false, responsive: true, maintainAspectRatio: false, parsing: false, normalized: true,
      interaction: { mode: "nearest", axis: "x", intersect: false },
      plugins: {
        legend: { labels: { boxWidth: 10, font: { size: 11 } } },
        emptyNote: { text: opts.empty || "no samples yet" },
        tooltip: { callbacks: { label: c => c.dataset.label + ": " + (opts.fmt || fmtNum)(c.raw.v) } },
      },
      scales: {
        x: { type: "linear", ticks: { maxTicksLimit: 6, callback: v => clock(v), font: { size: 10 } } },
        y: Object.assign({ beginAtZero: true, ticks: { font: { size: 10 }, callback: v => (opts.fmt || fmtNum)(v) } }, opts.y || {}),
      },
    },
    plugins: [emptyNote],
  });
  if ((opts.y || {}).type === "logarithmic") { // label the powers of ten only
    chart.options.scales.y.ticks.callback = v => Math.abs(Math.log10(v) - Math.round(Math.log10(v))) < 1e-6 ? (opts.fmt || fmtNum)(v) : "";
  }
  chart.$atoll = { fmt: opts.fmt || fmtNum, log: (opts.y || {}).type === "logarithmic", fixedMax: (opts.y || {}).max, caption: $(id + "-max"), cap: null };
  return chart;
}

function dataset(label, color, dash) {
  const ds = { label, data: [], borderColor: color, backgroundColor: color, borderWidth: 1.5, spanGaps: false, tension: 0 };
  if (dash) ds.borderDash = [4, 3];
  // A point is drawn where a line cannot show it (no neighbour), and where it is clipped.
  ds.pointRadius = c => (c.raw && c.chart.$atoll.cap !== null && c.raw.v > c.chart.$atoll.cap) ? 4 : (c.raw && c.raw.y !== null && isolated(c) ? 2.5 : 0);
  ds.pointStyle = c => (c.raw && c.chart.$atoll.cap !== null && c.raw.v > c.chart.$atoll.cap) ? "triangle" : "circle";
  return ds;
}

function makeCharts() {
  ui.charts.util = lineChart("p-util", [["allocated", "#4e79a7"], ["reported by agents", "#f28e2b"], ["measured (NVML)", "#59a14f"]],
    { y: { max: 100 }, fmt: v => fmtNum(v) + "%" });
  ui.charts.gangs = lineChart("p-gangs", [["running", "#59a14f"], ["pending", "#e15759"]], { y: { ticks: { precision: 0, font: { size: 10 } } } });
  // Latencies span microseconds (a cycle) to minutes (a gang's wait): a log axis.
  ui.charts.lat = lineChart("p-lat", [["scheduling cycle", "#4e79a7"], ["gang wait to placement", "#f28e2b"], ["Paxos commit", "#b07aa1"]],
    { y: { type: "logarithmic", beginAtZero: false }, fmt: fmtMs, empty: "no cycle, placement or commit yet" });
  ui.charts.store = lineChart("p-store", [["shared memory", "#4e79a7"], ["spilled to disk", "#9c755f"]],
    { fmt: v => fmtBytes(v * 1048576), empty: "no store figures (the leader's agents report them)" });
  ui.charts.xfer = lineChart("p-xfer", [["transfer plane", "#76b7b2"]], { fmt: v => fmtBytes(v) + "/s", y: { suggestedMax: 1048576 } });
  ui.charts.prog = lineChart("p-prog", [], { y: { beginAtZero: false }, empty: "no job reports progress (sdk Gang.Report)" });
}

function push(ds, x, v) {
  ds.data.push({ x, y: null, v: v === undefined || v === null || !isFinite(v) ? null : v });
}

// trim drops the points older than the window.
function trim(chart, from) {
  for (const ds of chart.data.datasets) {
    let i = 0;
    while (i < ds.data.length && ds.data[i].x < from) i++;
    if (i) ds.data.splice(0, i);
  }
}

// redraw sets what each point draws (clipped or not), the axes and the caption.
function redraw(chart, from, to) {
  const a = chart.$atoll;
  const vals = [];
  let top = null, topLabel = "";
  for (const ds of chart.data.datasets) {
    for (const p of ds.data) {
      if (p.v === null) continue;
      vals.push(p.v);
      if (top === null || p.v > top) { top = p.v; topLabel = ds.label; }
    }
  }
  a.cap = null;
  if (!a.log && a.fixedMax === undefined && vals.length >= ROBUST_MIN_POINTS) {
    const sorted = vals.slice().sort((x, y) => x - y);
    const k = Math.max(1, Math.floor(ROBUST_OUTLIERS * sorted.length)); // the outliers allowed
    const rest = sorted[sorted.length - 1 - k]; // the largest of the others
    if (rest > 0 && top > ROBUST_FACTOR * rest) a.cap = 1.5 * rest;
  }
  for (const ds of chart.data.datasets) {
    for (const p of ds.data) {
      if (p.v === null) p.y = null;
      else if (a.log) p.y = Math.max(p.v, 1e-3); // a log axis has no 0
      else p.y = a.cap !== null ? Math.min(p.v, a.cap) : p.v;
    }
  }
  const y = chart.options.scales.y;
  if (a.fixedMax === undefined) y.max = a.cap !== null ? a.cap : undefined;
  chart.options.scales.x.min = from;
  chart.options.scales.x.max = to;
  if (a.caption) {
    a.caption.textContent = top === null ? "" : "max " + a.fmt(top) + (chart.data.datasets.length > 1 ? " (" + topLabel + ")" : "") +
      (a.cap !== null ? " · axis clipped at " + a.fmt(a.cap) + ", ▲ above" : "");
  }
  chart.update("none");
}

// span is the time range the plots show: from the oldest point kept to the newest sample.
function span() {
  const to = ui.lastT || (ui.state ? Date.parse(ui.state.time) : Date.now());
  const from = Math.max(to - WINDOW_MS, ui.firstT || to - MIN_SPAN_MS);
  return [Math.min(from, to - MIN_SPAN_MS), to];
}

function addSamples(samples) {
  samples = list(samples);
  const c = ui.charts;
  for (const s of samples) {
    if (typeof s.t !== "number") continue;
    if (!ui.firstT) ui.firstT = s.t;
    const d = c.util.data.datasets;
    push(d[0], s.t, 100 * num(s.util_allocated));
    push(d[1], s.t, typeof s.util_reported === "number" ? 100 * s.util_reported : null);
    push(d[2], s.t, typeof s.util_measured === "number" ? 100 * s.util_measured : null);
    const g = c.gangs.data.datasets;
    push(g[0], s.t, num(s.running));
    push(g[1], s.t, num(s.pending));
    for (const [q, n] of Object.entries(s.queues || {})) {
      let ds = g.find(x => x.label === "pending in " + q);
      if (!ds) {
        ds = dataset("pending in " + q, colorOf("queue/" + q), true);
        ds.borderWidth = 1;
        g.push(ds);
      }
      push(ds, s.t, n);
    }
    const l = c.lat.data.datasets;
    push(l[0], s.t, s.cycle_ms);
    push(l[1], s.t, s.wait_ms);
    push(l[2], s.t, s.commit_ms);
    const st = c.store.data.datasets;
    push(st[0], s.t, s.leading ? num(s.store_hot) / 1048576 : null);
    push(st[1], s.t, s.leading ? num(s.store_cold) / 1048576 : null);
    push(c.xfer.data.datasets[0], s.t, typeof s.transfer_bps === "number" ? s.transfer_bps : null);
  }
  if (samples.length) ui.lastT = Math.max(ui.lastT, samples[samples.length - 1].t);
  const [from, to] = span();
  for (const k of ["util", "gangs", "lat", "store", "xfer"]) { trim(c[k], to - WINDOW_MS); redraw(c[k], from, to); }
}

// runOf numbers the runs of a gang name (a gang spawned again under it is another run)
// and says whether a report starts a new generation of its run (a restart).
function runOf(key, p) {
  const runs = ui.runs[key] || (ui.runs[key] = {});
  const uid = p.uid || "";
  let r = runs[uid];
  const t = Date.parse(p.time);
  if (!r) {
    r = runs[uid] = { n: Object.keys(runs).length + 1, start: t, gen: p.generation || 0 };
    return { r, restarted: false };
  }
  const restarted = (p.generation || 0) !== r.gen;
  r.gen = p.generation || 0;
  return { r, restarted };
}

async function pollProgress(st) {
  const chart = ui.charts.prog;
  for (const g of list(st.gangs)) {
    if (!g.progress) continue;
    const since = ui.progressT[g.key] || 0;
    const pts = list(await get("/ui/api/progress?gang=" + encodeURIComponent(g.key) + "&since=" + since));
    for (const p of pts) {
      const t = Date.parse(p.time);
      if (!isFinite(t)) continue;
      const { r, restarted } = runOf(g.key, p);
      for (const [m, v] of Object.entries(p.metrics || {})) {
        const id = g.key + "\u0000" + m + "\u0000" + (p.uid || "");
        let ds = chart.data.datasets.find(x => x.$id === id);
        if (!ds) {
          ds = dataset(g.key + " " + m + " · run " + r.n + " from " + clock(r.start), colorOf(id));
          ds.$id = id;
          chart.data.datasets.push(ds);
        } else if (restarted) {
          ds.data.push({ x: t, y: null, v: null }); // a restart: the line breaks
        }
        push(ds, t, v);
      }
      ui.progressT[g.key] = Math.max(ui.progressT[g.key] || 0, t);
      if (!ui.firstT || t < ui.firstT) ui.firstT = t;
    }
  }
  const [from, to] = span();
  trim(chart, to - WINDOW_MS);
  chart.data.datasets = chart.data.datasets.filter(ds => ds.data.length > 0);
  redraw(chart, from, to);
}

// ---- events ------------------------------------------------------------------------

function subject(e) {
  if (e.gang) return e.job + "/" + e.gang + " g" + (e.generation || 0);
  return e.job || e.machine || "";
}

function detail(e) {
  const parts = [];
  if (list(e.machines).length) parts.push("on " + e.machines.join(", ") + " (" + (e.islands || 0) + " island(s))");
  if (e.scores && typeof e.scores.allreduce_us === "number") parts.push("modeled AllReduce " + e.scores.allreduce_us.toFixed(0) + " µs");
  if (e.reason) parts.push(e.reason);
  return parts.join(" · ");
}

function renderEvents() {
  const job = $("job-filter").value;
  const shown = ui.events.filter(e => !job || e.job === job).slice(-300).reverse();
  $("events").tBodies[0].replaceChildren(...shown.map(e => el("tr", { "data-kind": e.kind, "data-job": e.job || "" },
    el("td", { text: clock(Date.parse(e.time)) }),
    el("td", { class: "ev-kind", text: e.kind }),
    el("td", { text: subject(e) }),
    el("td", { class: "muted", text: detail(e) }))));
  if (!shown.length) $("events").tBodies[0].append(emptyRow(4, "no event yet"));
}

async function pollEvents() {
  const evs = list(await get("/ui/api/events?after=" + ui.lastSeq + "&limit=1000"));
  if (!evs.length) { if (!ui.events.length) section("events", renderEvents); return; }
  for (const e of evs) { ui.events.push(e); if (e.job) ui.jobs.add(e.job); }
  ui.lastSeq = Math.max(ui.lastSeq, num(evs[evs.length - 1].seq));
  if (ui.events.length > MAX_EVENTS) ui.events.splice(0, ui.events.length - MAX_EVENTS);
  section("events", renderEvents);
}

// ---- the loop ----------------------------------------------------------------------

async function tick() {
  try {
    const st = await get("/ui/api/state");
    ui.state = st;
    $("auth").hidden = true;
    $("app").hidden = false;
    document.body.dataset.auth = "ok";
    render(st);
    const samples = await get("/ui/api/series?since=" + ui.lastT);
    section("plots", () => addSamples(samples));
    await pollEvents();
    await pollProgress(st);
    document.body.dataset.ready = "1";
  } catch (err) {
    if (err instanceof AuthError) {
      sessionStorage.removeItem("atoll-dashboard-token");
      refuse("The head refused this dashboard's token: open the address that `atoll status` prints for this cluster.");
      return; // no more polling without a valid token
    }
    if (!ui.errors) {
      $("live").textContent = "no answer: " + err.message;
      $("live").classList.add("stale");
    }
  }
  setTimeout(tick, POLL_MS);
}

function main() {
  ui.token = takeToken();
  if (!ui.token) {
    refuse("");
    return;
  }
  $("job-filter").addEventListener("change", () => section("events", renderEvents));
  makeCharts();
  tick();
}

document.addEventListener("DOMContentLoaded", main);
