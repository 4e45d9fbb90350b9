// Atoll dashboard: polls the head's read endpoints (/ui/api/*) with the dashboard token and
// draws the cluster map, the gangs, the plots (Chart.js) and the events.
"use strict";

const POLL_MS = 1000;
const WINDOW_MS = 15 * 60 * 1000; // plots keep the last 15 minutes
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
  charts: {},
  jobs: new Set(),
};

function $(id) { return document.getElementById(id); }

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
  if (!n) return "0 B";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return n.toFixed(i ? 1 : 0) + " " + u[i];
}
function pct(v) { return v === undefined || v === null ? "–" : (100 * v).toFixed(0) + "%"; }
function clock(ms) { return new Date(ms).toLocaleTimeString([], { hour12: false }); }

// ---- tiles -------------------------------------------------------------------------

function renderTiles(st) {
  const t = st.totals;
  const tiles = [
    ["GPUs", t.gpus, "gpus-total"],
    ["allocated", t.allocated + (t.shared ? " (" + t.shared + " shared)" : ""), "gpus-allocated"],
    ["free", t.free, "gpus-free"],
    ["machines alive", t.machines_alive + " / " + t.machines, "machines"],
    ["gangs running", t.running + t.starting + t.restarting, "gangs-running"],
    ["gangs pending", t.pending, "gangs-pending"],
    ["GPU use (agents)", pct(t.util_reported), "util"],
    ["object store", fmtBytes(t.store_hot_bytes) + " shm", "store"],
  ];
  const box = $("tiles");
  box.replaceChildren(...tiles.map(([k, v, id]) => el("div", { class: "tile", "data-tile": id },
    el("div", { class: "v", text: String(v) }), el("div", { class: "k", text: k }))));
}

// ---- the map -----------------------------------------------------------------------

function renderMap(st) {
  const live = st.gangs.filter(g => g.gpus > 0);
  $("legend").replaceChildren(
    el("span", { class: "chip", "data-gang": "" }, el("span", { class: "sw free-sw" }), "free"),
    ...live.map(g => {
      const sw = el("span", { class: "sw" });
      sw.style.background = colorOf(g.key);
      return el("span", { class: "chip" + (ui.selected === g.key ? " sel" : ""), "data-gang": g.key, onclick: () => select(g.key) }, sw, g.key);
    }));
  const free = $("legend").querySelector(".free-sw");
  if (free) free.style.background = "var(--free)";
  const racks = st.racks.map(r => el("div", { class: "rack", "data-rack": r.rack },
    el("div", { class: "title", text: "rack " + r.rack }),
    el("div", { class: "machines" }, ...r.machines.map(machineBox))));
  $("map").replaceChildren(...racks);
}

function machineBox(m) {
  const kind = m.simulated ? "simulated" : "real";
  const load = m.load ? " · cpu " + pct(m.load.cpu) + " · mem " + pct(m.load.mem) : "";
  const box = el("div", { class: "machine" + (m.alive ? "" : " dead"), "data-machine": m.name,
    title: m.alive ? "" : "dead: " + (m.reason || "") },
  el("div", { class: "name", text: m.name + (m.alive ? "" : " (dead)") }),
  el("div", { class: "meta", text: (m.model || m.type || "") + " · " + m.free + "/" + m.gpus + " free · " + kind + load }));
  const isl = el("div", { class: "islands" });
  for (const is of m.islands) {
    const grid = el("div", { class: "island", title: is.id >= 0 ? "NVLink island " + is.id : "no NVLink island", "data-island": is.id });
    for (const g of is.gpus) grid.append(gpuCell(m, g, is.id));
    isl.append(grid);
  }
  box.append(isl);
  return box;
}

function gpuCell(m, g, island) {
  const holders = g.holders || [];
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
  if (g.mig && g.mig.length) c.append(el("span", { class: "mig", text: "M" + g.mig.length }));
  if (ui.selected && gang !== ui.selected) c.classList.add("dim");
  return c;
}

function select(key) {
  ui.selected = ui.selected === key ? "" : key;
  if (ui.state) render(ui.state);
}

function renderDetail(st) {
  const d = $("detail");
  const g = st.gangs.find(x => x.key === ui.selected);
  if (!g) { d.hidden = true; return; }
  d.hidden = false;
  const p = g.placement || {};
  const sc = p.scores || {};
  const rows = [
    ["gang", g.key + " (" + g.state + ", generation " + g.generation + ")"],
    ["workers", g.ready + " ready of " + g.workers + " · " + g.gpus + " GPUs · queue " + g.queue],
    ["placement", (p.machines || []).join(", ") + " · " + (p.islands || 0) + " island(s)"],
    ["scores", ["topology", "fragmentation", "load", "binpack", "total"].filter(k => k in sc).map(k => k + " " + sc[k].toFixed(2)).join(" · ")],
    ["modeled AllReduce", sc.allreduce_us !== undefined ? sc.allreduce_us.toFixed(0) + " µs (machines crossed " + (sc.machines_crossed || 0) + ", racks " + (sc.racks_crossed || 0) + ")" : "–"],
    ["restarts", String(g.restarts) + (g.reason ? " · " + g.reason : "")],
    ["checkpoints", g.checkpoints ? g.checkpoints + " kept, newest step " + g.last_checkpoint : "none"],
  ];
  const members = (p.members || []).map((m, r) => "rank " + r + " → " + m.machine + " GPU " + (m.gpus || []).join(",") +
    (m.islands ? " (island " + m.islands.join(",") + ")" : "")).join("; ");
  rows.push(["members", members]);
  d.replaceChildren(el("table", {}, ...rows.map(([k, v]) => el("tr", {}, el("td", { class: "muted", text: k }), el("td", { text: v })))));
}

// ---- tables ------------------------------------------------------------------------

function renderGangs(st) {
  const body = $("gangs").tBodies[0];
  body.replaceChildren(...st.gangs.map(g => {
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
      el("td", { text: g.ready + "/" + g.workers }),
      el("td", { text: String(g.gpus) }),
      el("td", { text: String(g.generation) }),
      el("td", { text: String(g.restarts) }),
      el("td", { text: g.checkpoints ? "step " + g.last_checkpoint + " (" + g.checkpoints + ")" : "–" }),
      el("td", { text: prog }),
      el("td", { class: "muted", text: g.reason || "" }));
  }));
  $("queues").tBodies[0].replaceChildren(...st.queues.map(q => el("tr", { "data-queue": q.name },
    el("td", { text: q.name }), el("td", { text: String(q.pending) }), el("td", { text: String(q.running) }),
    el("td", { text: String(q.gpus) }), el("td", { text: String(q.max_priority) }))));
  for (const j of st.jobs) ui.jobs.add(j.name);
  const sel = $("job-filter");
  const have = new Set([...sel.options].map(o => o.value));
  for (const j of [...ui.jobs].sort()) if (!have.has(j)) sel.append(el("option", { value: j, text: j }));
}

function renderWhere(st) {
  const heads = (st.heads || []).length;
  $("where").textContent = "leader head " + st.leader + " · served by head " + st.served_by +
    (st.leading ? "" : " (a follower's view: the leader does not answer)") + " · revision " + st.revision + (heads ? " · " + heads + " heads" : "");
  const l = $("live");
  l.textContent = "updated " + clock(Date.parse(st.time));
  l.classList.remove("stale");
}

function render(st) {
  renderWhere(st);
  renderTiles(st);
  renderMap(st);
  renderDetail(st);
  renderGangs(st);
}

// ---- plots -------------------------------------------------------------------------

function lineChart(id, datasets, yOpts, points) {
  const ctx = $(id);
  return new Chart(ctx, {
    type: "line",
    data: { datasets: datasets.map(([label, color]) => ({ label, data: [], borderColor: color, backgroundColor: color,
      borderWidth: 1.5, pointRadius: points || 0, spanGaps: false, tension: 0 })) },
    options: {
      animation: false, responsive: true, maintainAspectRatio: false, parsing: false, normalized: true,
      interaction: { mode: "nearest", axis: "x", intersect: false },
      plugins: { legend: { labels: { boxWidth: 10, font: { size: 11 } } } },
      scales: {
        x: { type: "linear", ticks: { maxTicksLimit: 6, callback: v => clock(v), font: { size: 10 } } },
        y: Object.assign({ beginAtZero: true, ticks: { font: { size: 10 } } }, yOpts || {}),
      },
    },
  });
}

function makeCharts() {
  ui.charts.util = lineChart("p-util", [["allocated", "#4e79a7"], ["reported by agents", "#f28e2b"], ["measured (NVML)", "#59a14f"]], { max: 100 });
  ui.charts.gangs = lineChart("p-gangs", [["running", "#59a14f"], ["pending", "#e15759"]]);
  // Latencies are sparse (a cycle when a gang waits): draw each sample as a point.
  ui.charts.lat = lineChart("p-lat", [["scheduling cycle", "#4e79a7"], ["gang wait to placement", "#f28e2b"], ["Paxos commit", "#b07aa1"]], {}, 2);
  ui.charts.store = lineChart("p-store", [["shared memory", "#4e79a7"], ["spilled to disk", "#9c755f"]]);
  ui.charts.xfer = lineChart("p-xfer", [["transfer plane", "#76b7b2"]]);
  ui.charts.prog = lineChart("p-prog", [], { beginAtZero: false });
}

function push(ds, x, y) {
  if (y === undefined || y === null) { ds.data.push({ x, y: null }); return; }
  ds.data.push({ x, y });
}

function trim(chart, now) {
  for (const ds of chart.data.datasets) {
    let i = 0;
    while (i < ds.data.length && ds.data[i].x < now - WINDOW_MS) i++;
    if (i) ds.data.splice(0, i);
  }
}

function addSamples(samples) {
  if (!samples.length) return;
  const c = ui.charts;
  for (const s of samples) {
    const d = c.util.data.datasets;
    push(d[0], s.t, 100 * s.util_allocated);
    push(d[1], s.t, s.util_reported !== undefined ? 100 * s.util_reported : null);
    push(d[2], s.t, s.util_measured !== undefined ? 100 * s.util_measured : null);
    const g = c.gangs.data.datasets;
    push(g[0], s.t, s.running);
    push(g[1], s.t, s.pending);
    for (const [q, n] of Object.entries(s.queues || {})) {
      let ds = g.find(x => x.label === "pending in " + q);
      if (!ds) {
        const col = colorOf("queue/" + q);
        ds = { label: "pending in " + q, data: [], borderColor: col, backgroundColor: col, borderWidth: 1, borderDash: [4, 3], pointRadius: 0 };
        g.push(ds);
      }
      push(ds, s.t, n);
    }
    const l = c.lat.data.datasets;
    push(l[0], s.t, s.cycle_ms);
    push(l[1], s.t, s.wait_ms);
    push(l[2], s.t, s.commit_ms);
    const st = c.store.data.datasets;
    push(st[0], s.t, s.leading ? s.store_hot / 1048576 : null);
    push(st[1], s.t, s.leading ? s.store_cold / 1048576 : null);
    push(c.xfer.data.datasets[0], s.t, s.transfer_bps !== undefined ? s.transfer_bps / 1e6 : null);
  }
  const now = samples[samples.length - 1].t;
  for (const k of ["util", "gangs", "lat", "store", "xfer"]) { trim(c[k], now); c[k].update("none"); }
  ui.lastT = now;
}

async function pollProgress(st) {
  const chart = ui.charts.prog;
  let changed = false;
  for (const g of st.gangs) {
    if (!g.progress) continue;
    const since = ui.progressT[g.key] || 0;
    const pts = await get("/ui/api/progress?gang=" + encodeURIComponent(g.key) + "&since=" + since);
    for (const p of pts) {
      const t = Date.parse(p.time);
      for (const [m, v] of Object.entries(p.metrics || {})) {
        const label = g.key + " " + m;
        let ds = chart.data.datasets.find(x => x.label === label);
        if (!ds) {
          const col = colorOf(label);
          ds = { label, data: [], borderColor: col, backgroundColor: col, borderWidth: 1.5, pointRadius: 0 };
          chart.data.datasets.push(ds);
        }
        ds.data.push({ x: t, y: v });
        changed = true;
      }
      ui.progressT[g.key] = Math.max(ui.progressT[g.key] || 0, t);
    }
  }
  if (changed) { trim(chart, Date.now()); chart.update("none"); }
}

// ---- events ------------------------------------------------------------------------

function subject(e) {
  if (e.gang) return e.job + "/" + e.gang + " g" + (e.generation || 0);
  return e.job || e.machine || "";
}

function detail(e) {
  const parts = [];
  if (e.machines && e.machines.length) parts.push("on " + e.machines.join(", ") + " (" + (e.islands || 0) + " island(s))");
  if (e.scores && e.scores.allreduce_us !== undefined) parts.push("modeled AllReduce " + e.scores.allreduce_us.toFixed(0) + " µs");
  if (e.reason) parts.push(e.reason);
  return parts.join(" · ");
}

function renderEvents() {
  const job = $("job-filter").value;
  const shown = ui.events.filter(e => !job || e.job === job).slice(-300).reverse();
  $("events").tBodies[0].replaceChildren(...shown.map(e => el("tr", { "data-kind": e.kind, "data-job": e.job || "" },
    el("td", { text: new Date(Date.parse(e.time)).toLocaleTimeString([], { hour12: false }) }),
    el("td", { class: "ev-kind", text: e.kind }),
    el("td", { text: subject(e) }),
    el("td", { class: "muted", text: detail(e) }))));
}

async function pollEvents() {
  const evs = await get("/ui/api/events?after=" + ui.lastSeq + "&limit=1000");
  if (!evs.length) return;
  for (const e of evs) { ui.events.push(e); if (e.job) ui.jobs.add(e.job); }
  ui.lastSeq = evs[evs.length - 1].seq;
  if (ui.events.length > MAX_EVENTS) ui.events.splice(0, ui.events.length - MAX_EVENTS);
  renderEvents();
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
    addSamples(await get("/ui/api/series?since=" + ui.lastT));
    await pollEvents();
    await pollProgress(st);
    document.body.dataset.ready = "1";
  } catch (err) {
    if (err instanceof AuthError) {
      sessionStorage.removeItem("atoll-dashboard-token");
      refuse("The head refused this dashboard's token: open the address that `atoll status` prints for this cluster.");
      return; // no more polling without a valid token
    }
    $("live").textContent = "no answer: " + err.message;
    $("live").classList.add("stale");
  }
  setTimeout(tick, POLL_MS);
}

function main() {
  ui.token = takeToken();
  if (!ui.token) {
    refuse("");
    return;
  }
  $("job-filter").addEventListener("change", renderEvents);
  makeCharts();
  tick();
}

document.addEventListener("DOMContentLoaded", main);
