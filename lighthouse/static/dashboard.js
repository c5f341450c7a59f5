// The lighthouse dashboard: fetches /status every 2 s and redraws in place.
// Charts are inline SVG drawn here (no library, no network beyond /status);
// lighthouse/coordinator/dashboard.py says why. Field meanings: lighthouse/README.md.
"use strict";

const REFRESH_MS = 2000;
const FETCH_TIMEOUT_MS = 5000;
const LINES_UP_TO = 8; // more replicas: the charts show a median in a min-max band
const PALETTE = ["#3056d3", "#d0312d", "#2e8b57", "#d98a00", "#8e44ad", "#1a9bb0", "#b5488f", "#6b7385"];
// The SVG namespace, read from an inline <svg> rather than spelled out: the served
// page then holds no absolute URL at all (a test checks that nothing is fetched from outside).
const SVG_NS = document.getElementById("svg-ns").namespaceURI;

// ---- numbers with units -------------------------------------------------------
// Every number a person reads carries its unit, and never more than 3 decimals:
// a value too small for its unit moves to a smaller one (ms -> µs, steps/s ->
// steps/min -> steps/h, GB -> MB ...), so 3 significant digits stay readable.
const MAX_DECIMALS = 3;
function sig(x, digits = 3) {
  // x rounded to `digits` significant digits (at most MAX_DECIMALS decimals),
  // thousands separated, no trailing zeros
  if (x === null || x === undefined || !Number.isFinite(x)) return "—";
  if (x === 0) return "0";
  const mag = Math.floor(Math.log10(Math.abs(x)));
  const decimals = Math.max(0, Math.min(MAX_DECIMALS, digits - 1 - mag));
  return x.toLocaleString("en-US", {maximumFractionDigits: decimals});
}
function scaled(x, units) {
  // x (in units[0][1]) in the first of `units` ([factor, name], larger first) where
  // it is at least 1, else the last: "12.3 µs", "0.5 steps/h"
  for (const [factor, name] of units) if (Math.abs(x * factor) >= 1) return `${sig(x * factor)} ${name}`;
  const [factor, name] = units[units.length - 1];
  return `${sig(x * factor)} ${name}`;
}
const fmt = {
  int: n => (n === null || n === undefined ? "—" : Number(n).toLocaleString("en-US", {maximumFractionDigits: 0})),
  ms(ms) {
    if (ms === null || ms === undefined || !Number.isFinite(ms)) return "—";
    if (ms === 0) return "0 ms";
    if (Math.abs(ms) < 1000) return scaled(ms, [[1, "ms"], [1000, "µs"], [1e6, "ns"]]);
    return fmt.secs(ms / 1000);
  },
  secs(s) {
    if (s === null || s === undefined || !Number.isFinite(s)) return "—";
    if (s < 1) return fmt.ms(s * 1000);
    if (s < 60) return sig(s) + " s";
    const [big, small, unitBig, unitSmall] = s < 3600 ? [Math.floor(s / 60), Math.round(s % 60), "min", "s"]
      : [Math.floor(s / 3600), Math.round((s % 3600) / 60), "h", "min"];
    return `${fmt.int(big)} ${unitBig}` + (small ? ` ${small} ${unitSmall}` : "");
  },
  // a duration as the heal figures give it, in seconds down to 10 ms: "0.42 s"
  heal_s: s => (s === null || s === undefined || !Number.isFinite(s) ? "—" : s >= 0.01 ? sig(s) + " s" : fmt.secs(s)),
  rate(r) {
    if (r === null || r === undefined || !Number.isFinite(r)) return "—";
    if (r === 0) return "0 steps/s";
    // below 0.1 steps/s the minute (then the hour) keeps three digits in view
    for (const [factor, name] of [[1, "steps/s"], [60, "steps/min"], [3600, "steps/h"]]) {
      if (Math.abs(r * factor) >= 0.1 || factor === 3600) return `${sig(r * factor)} ${name}`;
    }
    return "—";
  },
  // a step-rate axis label, short (the caption says steps), in one unit for the
  // whole axis: the one its top value `max` reads best in
  rateAxis: (r, max) => (max >= 0.1 ? sig(r) + "/s" : max * 60 >= 0.1 ? sig(r * 60) + "/min" : sig(r * 3600) + "/h"),
  bytes(n) {
    // decimal units (GB/s is 10^9 bytes per second), three significant digits: "12.3 MB"
    if (n === null || n === undefined || !Number.isFinite(Number(n))) return "—";
    const units = ["B", "kB", "MB", "GB", "TB", "PB", "EB"];
    let v = Number(n), i = 0;
    while (i < units.length - 1 && Math.abs(Number(v.toPrecision(3))) >= 1000) { v /= 1000; i++; }
    return i === 0 ? `${fmt.int(v)} B` : `${sig(v)} ${units[i]}`;
  },
  bytesPerS: gbPerS => (gbPerS === null || gbPerS === undefined ? "—" : fmt.bytes(gbPerS * 1e9) + "/s"),
  ago: s => (s === null || s === undefined ? "—" : fmt.secs(s) + " ago"),
  clock: unixMs => new Date(unixMs).toLocaleTimeString("en-GB", {hour12: false}),
};

// ---- small DOM helpers ----------------------------------------------------------
function el(tag, attrs = {}, ...children) {
  const node = tag.startsWith("svg:") ? document.createElementNS(SVG_NS, tag.slice(4)) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "text") node.textContent = v;
    else if (v !== null && v !== undefined) node.setAttribute(k, String(v));
  }
  for (const c of children) if (c) node.appendChild(c);
  return node;
}
function setText(id, text) { document.getElementById(id).textContent = text; }

// ---- charts ---------------------------------------------------------------------
function niceMax(v) {
  if (!(v > 0)) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 2.5, 5, 10]) if (v <= m * p) return m * p;
  return 10 * p;
}
function pathOf(points, sx, sy) {
  // "M x y L ..." with a new segment after every missing value
  let d = "", pen = false;
  for (const [x, y] of points) {
    if (y === null || y === undefined || !Number.isFinite(y)) { pen = false; continue; }
    d += (pen ? "L" : "M") + sx(x).toFixed(1) + " " + sy(y).toFixed(1);
    pen = true;
  }
  return d;
}
function chart(box, {lines, band, windowS, yFormat, markers}) {
  // lines: [{id, color, points: [[x_seconds (<= 0), y]], derived}]; band: {lo, hi} points or null
  // drawn at the box's own width, so labels keep their size in narrow windows
  const W = Math.max(280, Math.round(box.clientWidth || 600)), H = 190, L = 62, R = 8, T = 8, B = 22;
  let ymax = 0;
  for (const s of lines) for (const [, y] of s.points) if (y > ymax) ymax = y;
  if (band) for (const [, y] of band.hi) if (y > ymax) ymax = y;
  ymax = niceMax(ymax * 1.05);
  const sx = x => L + ((x + windowS) / windowS) * (W - L - R);
  const sy = y => T + (1 - y / ymax) * (H - T - B);
  const svg = el("svg:svg", {viewBox: `0 0 ${W} ${H}`, class: "chart", role: "img", "data-series": lines.length});
  for (let i = 0; i <= 4; i++) {
    const y = (ymax * i) / 4;
    svg.appendChild(el("svg:line", {class: "grid-line", x1: L, x2: W - R, y1: sy(y), y2: sy(y)}));
    svg.appendChild(el("svg:text", {class: "y-label", x: L - 4, y: sy(y) + 3, "text-anchor": "end", text: yFormat(y, ymax)}));
  }
  const stepS = [10, 15, 30, 60, 120, 300, 600, 900, 1800].find(t => windowS / t <= 6) || 3600;
  for (let x = 0; x >= -windowS; x -= stepS) {
    svg.appendChild(el("svg:line", {class: "grid-line", x1: sx(x), x2: sx(x), y1: T, y2: H - B}));
    const label = x === 0 ? "now" : -x < 60 ? `${-x} s ago` : `${sig(-x / 60)} min ago`;
    svg.appendChild(el("svg:text", {class: "x-label", x: sx(x), y: H - 6, "text-anchor": x === 0 ? "end" : "middle", text: label}));
  }
  for (const m of markers) {
    if (m.x < -windowS || m.x > 0) continue;
    const line = el("svg:line", {class: `marker marker-${m.kind}`, x1: sx(m.x), x2: sx(m.x), y1: T, y2: H - B});
    line.appendChild(el("svg:title", {text: m.text}));
    svg.appendChild(line);
  }
  if (band && band.lo.length) {
    const upper = pathOf(band.hi, sx, sy);
    const lower = band.lo.slice().reverse().map(([x, y]) => `L${sx(x).toFixed(1)} ${sy(y).toFixed(1)}`).join("");
    svg.appendChild(el("svg:path", {class: "band", d: upper + lower + "Z", fill: PALETTE[0]}));
  }
  if (!lines.some(s => s.points.some(([, y]) => y !== null && Number.isFinite(y)))) {
    svg.appendChild(el("svg:text", {class: "empty", x: (L + W - R) / 2, y: H / 2, "text-anchor": "middle",
      text: "no step samples yet (a replica needs two pings a few seconds apart)"}));
  }
  for (const s of lines) {
    const n = s.points.filter(([, y]) => y !== null && Number.isFinite(y)).length;
    const p = el("svg:path", {class: "series" + (s.derived ? " derived" : ""), d: pathOf(s.points, sx, sy),
      stroke: s.color, "data-replica-id": s.id, "data-points": n});
    p.appendChild(el("svg:title", {text: s.id}));
    svg.appendChild(p);
  }
  box.replaceChildren(svg);
}
function aggregate(seriesList, field, intervalS) {
  // per time bucket: min, median, max over the replicas that have a value there
  const buckets = new Map();
  for (const s of seriesList) {
    s.age_s.forEach((age, i) => {
      const v = s[field][i];
      if (v === null || v === undefined) return;
      const b = Math.round(age / intervalS);
      if (!buckets.has(b)) buckets.set(b, []);
      buckets.get(b).push(v);
    });
  }
  const keys = [...buckets.keys()].sort((a, b) => b - a);
  const lo = [], mid = [], hi = [];
  for (const k of keys) {
    const vs = buckets.get(k).sort((a, b) => a - b);
    const x = -k * intervalS;
    lo.push([x, vs[0]]); hi.push([x, vs[vs.length - 1]]);
    mid.push([x, vs.length % 2 ? vs[(vs.length - 1) / 2] : (vs[vs.length / 2 - 1] + vs[vs.length / 2]) / 2]);
  }
  return {lo, mid, hi};
}
function sparkline(values) {
  const svg = el("svg:svg", {class: "spark", viewBox: "0 0 100 22", preserveAspectRatio: "none"});
  const ys = values.filter(v => v !== null && Number.isFinite(v));
  if (ys.length >= 2) {
    const ymax = Math.max(...ys) || 1, n = values.length;
    const pts = values.map((v, i) => [i, v]);
    svg.appendChild(el("svg:path", {d: pathOf(pts, i => (i / Math.max(1, n - 1)) * 100, y => 21 - (y / ymax) * 19),
      "vector-effect": "non-scaling-stroke", "data-points": ys.length}));
  }
  return svg;
}

// ---- sections -------------------------------------------------------------------
const HEALTH_WORDS = {ok: "ok", behind: "behind", failing: "not committing", waiting: "waiting", outside: "not asking", silent: "silent",
  quarantined: "quarantined", dead: "dead", left: "left"};

function renderCards(s, healthRows) {
  const q = s.quorum;
  const rates = healthRows.filter(r => r.alive && r.steps_per_s !== null).map(r => r.steps_per_s).sort((a, b) => a - b);
  const median = rates.length ? rates[Math.floor(rates.length / 2)] : null;
  const tl = s.history.timeline;
  const count = kind => tl.filter(e => e.kind === kind).length;
  const r = s.step_report;
  const cards = [
    ["members", q === null ? "—" : fmt.int(q.members.length)],
    ["live replicas", fmt.int(s.live_count)],
    ["committed step", fmt.int(s.committed_step) + (s.run_ended ? " (run ended)" : "")],
    ["median step rate", fmt.rate(median)],
    ["median step time", r === null ? "—" : fmt.ms(r.median_step_time_ms)],
    ["slowest / median", r === null || r.slowest_over_median === null ? "—" : sig(r.slowest_over_median) + "×"],
    ["quorum age", q === null ? "—" : fmt.secs(q.age_s)],
    ["rounds issued", fmt.int(s.quorums_issued)],
    ["deaths (timeline)", fmt.int(tl.filter(e => e.kind === "death").reduce((n, e) => n + e.replica_ids.length, 0))],
    ["heals (timeline)", fmt.int(tl.filter(e => e.kind === "heal").reduce((n, e) => n + e.replica_ids.length, 0))],
    ["heal bytes (reported)", fmt.bytes(s.history.heal_bytes_total)],
    ["quarantines", fmt.int(count("quarantine"))],
    ["corruption findings (timeline)", fmt.int(count("integrity"))],
    ["up", fmt.secs((s.history.now_unix_ms - s.started_unix_ms) / 1000)],
  ];
  document.getElementById("cards").replaceChildren(...cards.map(([k, v]) =>
    el("div", {class: "card"}, el("div", {class: "v", text: v}), el("div", {class: "k", text: k}))));
}

function spanOf(h) {
  // the x axis: from the oldest sample (at least 1 min) to now, at most the history window
  let oldest = 0;
  for (const x of h.replicas) if (x.age_s.length) oldest = Math.max(oldest, x.age_s[0]);
  const span = [60, 120, 300, 600, 900, 1800, 3600, 7200].find(t => t >= oldest) || oldest;
  return Math.min(span, h.window_s);
}

function renderCharts(s) {
  const h = s.history;
  const series = h.replicas;
  const windowS = spanOf(h);
  const markers = h.timeline.filter(e => e.kind !== "quorum").map(e =>
    ({x: (e.unix_ms - h.now_unix_ms) / 1000, kind: e.kind, text: `${fmt.clock(e.unix_ms)} ${e.text}`}));
  const legend = document.getElementById("legend");
  const many = series.length > LINES_UP_TO;
  const derivedTimes = series.some(x => !x.step_time_reported);
  setText("rate-note", `(last ${fmt.secs(windowS)}${many ? `; median and min–max of ${series.length}` : ""})`);
  setText("time-note", derivedTimes ? "(dashed: derived from the step rate, not reported)" : "(as reported by the replicas)");
  for (const [field, boxId, yFormat] of [["steps_per_s", "chart-rate", fmt.rateAxis], ["step_time_ms", "chart-time", fmt.ms]]) {
    const box = document.getElementById(boxId);
    if (many) {
      const a = aggregate(series, field, h.sample_interval_s);
      chart(box, {lines: [{id: "median", color: PALETTE[0], points: a.mid, derived: false}],
        band: {lo: a.lo, hi: a.hi}, windowS, yFormat, markers});
    } else {
      const lines = series.map((x, i) => ({id: x.replica_id, color: PALETTE[i % PALETTE.length],
        points: x.age_s.map((age, j) => [-age, x[field][j]]),
        derived: field === "step_time_ms" && !x.step_time_reported}));
      chart(box, {lines, band: null, windowS, yFormat, markers});
    }
  }
  legend.replaceChildren(...(many
    ? [el("span", {text: `${series.length} replicas: the line is the median, the band spans the slowest to the fastest; per-replica sparklines in the tiles below`})]
    : series.map((x, i) => el("span", {}, el("i", {style: `background:${PALETTE[i % PALETTE.length]}`}), document.createTextNode(x.replica_id)))));
}

function renderReplicas(s, rows) {
  const byId = new Map(s.history.replicas.map(x => [x.replica_id, x]));
  // the job's work per step: the median over the replicas of their median work per step
  const jobBusy = s.stragglers && s.stragglers.job_busy_ms !== null ? s.stragglers.job_busy_ms : null;
  setText("replica-count", `(${rows.length}; ${rows.filter(r => r.status === "ok").length} ok)`);
  const counts = {};
  for (const r of rows) counts[r.status] = (counts[r.status] || 0) + 1;
  document.getElementById("health-key").replaceChildren(...Object.entries(counts).map(([k, n]) =>
    el("span", {class: `badge status-${k}`, text: `${HEALTH_WORDS[k] || k}: ${n}`})));
  document.getElementById("replicas").replaceChildren(...rows.map(r => {
    const lag = r.lag ? ` (−${fmt.int(r.lag)})` : "";
    const time = r.step_time_ms === null ? "—" : fmt.ms(r.step_time_ms) + (r.step_time_derived ? "*" : "");
    const series = byId.get(r.replica_id);
    const title = `${r.replica_id}: ${HEALTH_WORDS[r.status] || r.status}` +
      (r.quarantined_s !== null ? `, quarantined ${fmt.secs(r.quarantined_s)} more` : "") +
      (r.quarantine_reason ? ` (${r.quarantine_reason})` : "") +
      (r.busy_ms !== null && r.busy_ms !== undefined ? `; work per step ${fmt.ms(r.busy_ms)}` +
        (jobBusy !== null ? ` against the job's ${fmt.ms(jobBusy)}` : "") : "") +
      (r.commit_failures ? `, ${fmt.int(r.commit_failures)} step(s) in a row not committed (its log says why)` : "") +
      (r.step_time_derived ? "; * step time derived from the step rate" : "");
    return el("div", {class: `replica status-${r.status}`, "data-replica-id": r.replica_id, "data-status": r.status, title},
      el("div", {class: "id", text: r.replica_id}),
      el("div", {class: "row"}, el("span", {text: HEALTH_WORDS[r.status] || r.status}),
        el("span", {text: r.step === null ? "step —" : `step ${fmt.int(r.step)}${lag}`})),
      el("div", {class: "row"}, el("span", {text: fmt.rate(r.steps_per_s)}), el("span", {text: time})),
      r.busy_ms !== null && r.busy_ms !== undefined
        ? el("div", {class: "row", "data-busy": "1"}, el("span", {class: "muted", text: "work"}),
          el("span", {text: fmt.ms(r.busy_ms) + (jobBusy !== null ? ` / job ${fmt.ms(jobBusy)}` : "")}))
        : null,
      r.quarantine_reason ? el("div", {class: "reason muted", text: r.quarantine_reason}) : null,
      el("div", {class: "row"}, el("span", {class: "muted", text: r.alive ? "seen " + fmt.ago(r.last_seen_s_ago) : "gone"}),
        r.commit_failures ? el("span", {class: "failures", text: `${fmt.int(r.commit_failures)} not committed`}) : null),
      series ? sparkline(series.steps_per_s) : null);
  }));
}

// Events of earlier epochs seen by this page (a restarted lighthouse starts a new timeline).
const earlier = [];
let lastEpoch = null;
let lastTimeline = [];

function renderTimeline(s) {
  const h = s.history;
  if (lastEpoch !== null && s.epoch !== lastEpoch) {
    earlier.unshift({kind: "restart", unix_ms: h.now_unix_ms, text: `lighthouse restarted: epoch ${lastEpoch} → ${s.epoch} (seen by this page)`, replica_ids: []},
      ...lastTimeline.slice().reverse());
    earlier.length = Math.min(earlier.length, 300);
  }
  lastEpoch = s.epoch;
  lastTimeline = h.timeline;
  const shown = h.timeline.slice().reverse().slice(0, 300).concat(earlier);
  setText("timeline-note", `(${fmt.int(h.timeline.length)} of ${fmt.int(h.timeline_total)} events kept; heal bytes, seconds and GB/s as the healer measured them)`);
  document.getElementById("timeline").replaceChildren(...shown.map(e =>
    el("li", {class: `kind-${e.kind}` + (e.kind === "restart" ? " epoch-break" : ""), "data-kind": e.kind,
      "data-replica-ids": (e.replica_ids || []).concat(e.joined || [], e.left || []).join(" ")},
    el("span", {class: "muted", text: fmt.clock(e.unix_ms)}),
    el("span", {}, el("span", {class: "badge", text: e.kind.replace("_", " ")})),
    el("span", {}, document.createTextNode(e.text), healFigures(e)))));
}

function healFigures(e) {
  // what a reported heal moved: bytes, transfer seconds, GB/s (null fields: none reported)
  if (e.heal_bytes === null || e.heal_bytes === undefined) return null;
  const rate = fmt.bytesPerS(e.heal_gb_per_s);
  return el("span", {class: "heal-figures", title: "what the heal moved, as the healing replica measured it"},
    el("span", {class: "heal-bytes", text: fmt.bytes(e.heal_bytes)}),
    el("span", {class: "heal-seconds", text: fmt.heal_s(e.heal_s)}),
    el("span", {class: "heal-rate", text: rate}));
}

function renderTables(s) {
  const q = s.quorum;
  const fill = (id, rows, cells, cls) => document.querySelector(`#${id} tbody`).replaceChildren(...rows.map(r =>
    el("tr", {class: cls ? cls(r) : null}, ...cells(r).map(v => el("td", {text: v})))));
  fill("members", q === null ? [] : q.members, m => [m.replica_id, fmt.int(m.step), fmt.int(m.latest_step),
    m.step_time_ms ? fmt.ms(m.step_time_ms) : "—", m.address, m.store_address, fmt.int(m.world_size),
    m.last_seen_s_ago === null ? "dead" : fmt.ago(m.last_seen_s_ago)],
  m => (!m.alive ? "dead" : m.recovering ? "recovering" : null));
  fill("live", s.live, l => [l.replica_id, fmt.ago(l.last_seen_s_ago), l.pending ? "yes" : "no", fmt.int(l.liveness_streams)]);
}

function render(s) {
  setText("epoch", s.epoch);
  setText("qid", String(s.quorum_id));
  setText("next-kind", s.next_quorum.kind.replace("_", " "));
  setText("reason", s.next_quorum.reason);
  renderCards(s, s.health);
  renderCharts(s);
  renderReplicas(s, s.health);
  renderTimeline(s);
  renderTables(s);
  setText("updated", `updated ${fmt.clock(s.history.now_unix_ms)}, every ${REFRESH_MS / 1000} s`);
  document.body.dataset.rendered = String(Number(document.body.dataset.rendered || 0) + 1);
}

async function refresh() {
  const err = document.getElementById("err");
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(), FETCH_TIMEOUT_MS);
  try {
    const resp = await fetch("/status", {cache: "no-store", signal: abort.signal});
    if (!resp.ok) throw new Error(`HTTP ${resp.status}`);
    render(await resp.json());
    err.hidden = true;
  } catch (e) {
    err.textContent = `status unavailable (${e}); showing the last data, retrying every ${REFRESH_MS / 1000} s`;
    err.hidden = false;
  } finally {
    clearTimeout(timer);
    setTimeout(refresh, REFRESH_MS);
  }
}
refresh();
