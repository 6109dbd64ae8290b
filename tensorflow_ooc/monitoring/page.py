"""The ``/tfooc`` page: one HTML document with inline CSS and JavaScript, no external files.

The script polls ``tfooc/runs.json`` and ``tfooc/runs/RUN.json`` (every second by default;
``?poll=MS`` changes it; ``?page=N`` and ``?limit=N`` pick the runs table's page, 25 runs a page,
newest first) and draws the plots as inline SVG, so the page needs nothing beyond what
the scheduler's HTTP server serves and works offline. Plot points carry ``data-iteration`` and
``data-value`` attributes and every plot block ``data-iterations`` (how many iterations it
shows), which the browser test checks against the run's events.

A step whose iterations carry a log-likelihood (``loglik``: a CP-APR run, Poisson CP of counts)
is drawn as what it is: its log-likelihood (``pt-loglik``) and its KKT violation on a log axis
(``pt-kkt``) where a CP-ALS step has its fit and fit change, and seconds per outer iteration in
place of the per-mode bars its iterations do not record.

The runs table fits the window (fixed columns; long ids wrap; an error's first line is cut, all of
it on hover and on a click). A queued run has no start time. A run's errors are split by the
driver's attempt (``errors``: its latest attempt's; ``earlier_attempts``: those of attempts lost
before it), and a run that succeeded shows neither in red.
"""

from __future__ import annotations

PAGE = r"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>tfooc runs</title>
<style>
  :root { --fg: #1d2330; --muted: #667085; --line: #d0d5dd; --bg: #f7f8fa; --accent: #1f6feb; }
  body { font: 14px/1.4 system-ui, -apple-system, "Segoe UI", "DejaVu Sans", sans-serif; color: var(--fg);
         margin: 0; background: var(--bg); }
  header { background: #20242c; color: #fff; padding: 8px 16px; display: flex; gap: 16px; align-items: baseline; }
  header a { color: #9cc3ff; } header .muted { color: #aab; }
  main { padding: 12px 16px; }
  h1 { font-size: 18px; margin: 0; } h2 { font-size: 16px; margin: 16px 0 6px; } h3 { font-size: 14px; margin: 12px 0 4px; }
  table { border-collapse: collapse; background: #fff; }
  th, td { border-bottom: 1px solid var(--line); padding: 3px 8px; text-align: left; white-space: nowrap; }
  th { font-weight: 600; color: var(--muted); font-size: 12px; }
  tr.selected td { background: #eef4ff; }
  td.num { text-align: right; font-variant-numeric: tabular-nums; }
  a { color: var(--accent); text-decoration: none; }
  .state { display: inline-block; padding: 0 6px; border-radius: 8px; font-size: 12px; color: #fff; background: #888; }
  .state-running { background: #1f6feb; } .state-done { background: #1a7f37; } .state-failed { background: #cf222e; }
  .state-cancelled { background: #9a6700; } .state-lost { background: #8250df; } .state-skipped { background: #57606a; }
  .state-queued { background: #6e7781; } .state-retrying { background: #bc4c00; }
  .meta { color: var(--muted); }
  .plots { display: flex; flex-wrap: wrap; gap: 10px; }
  figure { margin: 0; background: #fff; border: 1px solid var(--line); border-radius: 4px; padding: 4px 6px; }
  figcaption { font-size: 12px; color: var(--muted); }
  svg text { font-size: 10px; fill: var(--muted); }
  .errors, .note { border-radius: 4px; padding: 6px 10px; margin: 8px 0; overflow-wrap: anywhere; }
  .errors { background: #fff0f0; border: 1px solid #f5c2c7; }
  .note { background: #f3f4f6; border: 1px solid var(--line); color: #3b4350; }
  .errors pre, .note pre { white-space: pre-wrap; font-size: 11px; max-height: 240px; overflow: auto; }
  /* the runs table fits the window: fixed columns, long ids and names wrap, an error's first line
     is cut with an ellipsis (all of it on hover, and on a click, which unfolds it) */
  #runs-table { table-layout: fixed; width: 100%; }
  #runs-table td { white-space: normal; overflow-wrap: anywhere; vertical-align: top; }
  #runs-table td.error-line, #runs-table td.earlier { white-space: nowrap; overflow: hidden; text-overflow: ellipsis; cursor: pointer; }
  #runs-table td.error-line.unfolded { white-space: pre-wrap; }
  #runs-table td.earlier { color: var(--muted); }
  td.wrap { white-space: normal; overflow-wrap: anywhere; }
  nav.pages { margin: 6px 0; display: flex; gap: 10px; align-items: baseline; }
  nav.pages button { font: inherit; padding: 1px 8px; }
  .empty { color: var(--muted); font-style: italic; }
</style>
</head>
<body data-state="loading">
<header>
  <h1>tensorflow_ooc runs</h1>
  <span class="muted" id="scheduler"></span>
  <a href="status">Dask dashboard</a>
  <a href="metrics">metrics</a>
  <span class="muted" id="updated"></span>
</header>
<main>
  <section id="runs"><p class="empty">loading...</p></section>
  <section id="cluster"></section>
  <section id="run"></section>
</main>
<script>
"use strict";
const params = new URLSearchParams(location.search);
const POLL = Math.max(200, parseInt(params.get("poll") || "1000", 10));
const BASE = location.pathname.replace(/\/+$/, "");          // .../tfooc
let selected = params.get("run") || (location.hash ? decodeURIComponent(location.hash.slice(1)) : null);
// the runs table's page (1 the newest runs) and its size (runs.json's ?page= and ?limit=)
let pageNo = Math.max(1, parseInt(params.get("page") || "1", 10) || 1);
const LIMIT = params.get("limit") ? Math.max(1, parseInt(params.get("limit"), 10) || 25) : null;
let polling = false;

function esc(s) {
  return String(s === undefined || s === null ? "" : s).replace(/[&<>"']/g,
    c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
}
function fmt(v, digits) {
  if (v === null || v === undefined || Number.isNaN(v)) return "";
  if (typeof v !== "number") return String(v);
  const a = Math.abs(v);
  if (a !== 0 && (a < 1e-3 || a >= 1e6)) return v.toExponential(digits === undefined ? 2 : digits);
  return v.toFixed(digits === undefined ? (a < 1 ? 4 : 2) : digits);
}
function bytes(v) {
  if (!v) return "0 B";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"]; let i = 0;
  while (v >= 1024 && i < u.length - 1) { v /= 1024; i++; }
  return v.toFixed(i ? 1 : 0) + " " + u[i];
}
function since(iso) {
  if (!iso) return "";
  const s = (Date.now() - Date.parse(iso)) / 1000;
  return s < 90 ? s.toFixed(0) + " s ago" : s < 5400 ? (s / 60).toFixed(0) + " min ago" : (s / 3600).toFixed(1) + " h ago";
}
function duration(a, b) {
  if (!a) return "";
  const s = ((b ? Date.parse(b) : Date.now()) - Date.parse(a)) / 1000;
  return s < 120 ? s.toFixed(1) + " s" : s < 7200 ? (s / 60).toFixed(1) + " min" : (s / 3600).toFixed(1) + " h";
}
function badge(state) { return `<span class="state state-${esc(state)}">${esc(state)}</span>`; }

// The fit axis spans at least 2e-6 (the page gives fits to 6 decimals; rounding noise of 1e-15 is
// drawn flat), and fit changes below 1e-12 (noise for float64 fits) sit on the log axis's floor.
const FIT_SPAN = 2e-6, CHANGE_FLOOR = 1e-12;
// A log-likelihood (a large negative sum): on the axis 6 significant digits, or 4 in exponent
// form from 1e6 (what the axis's margin holds), 9 (as the logs give it) in the tooltips; its axis
// spans at least LOGLIK_SPAN of its magnitude (summation noise).
const LOGLIK_SPAN = 1e-12;
function sig(v) { return Math.abs(v) >= 1e6 ? v.toExponential(3) : String(Number(v.toPrecision(6))); }
function exp8(v) { return v === null || v === undefined || Number.isNaN(v) ? "" : v.toExponential(8); }
// A log axis's label: two significant digits (fmt's fixed decimals wrote 0.003 as "0.0", a value a
// log axis never holds), in exponent form outside [1e-3, 1e4).
function logLabel(v) { const a = Math.abs(v); return a < 1e-3 || a >= 1e4 ? v.toExponential(1) : String(Number(v.toPrecision(2))); }
const COLORS = ["#1f6feb", "#d4a72c", "#1a7f37", "#cf222e", "#8250df", "#0598bc", "#bc4c00", "#57606a"];

// Axis labels that differ wherever the values do: the plot's own format first, then more
// significant digits until no two labels are alike (a converged fit's 0.948020 three times said nothing).
function axisLabels(vals, base) {
  let labs = vals.map(base);
  for (let p = 3; new Set(labs).size < labs.length && p <= 15; p++) {
    labs = vals.map(v => String(Number(v.toPrecision(p))));
  }
  return labs;
}

// A scatter-line plot of (x, y) points as SVG; points are <circle class="pt CLS">.
// opts: log (log axis of |y|, values below opts.floor drawn on the floor, class "floored"),
// minSpan (the least span of a linear axis: differences below it are noise, drawn flat),
// zero (a linear axis from 0), format, tip (the points' tooltip format; else format), color,
// xlabel (the x axis's label: "iteration" unless given).
function linePlot(title, xs, ys, cls, opts) {
  opts = opts || {};
  const W = 440, H = 170, L = 56, R = 8, T = 8, B = 22;
  const floor = opts.floor || 0;
  const pts = xs.map((x, i) => [x, ys[i]]).filter(p => p[1] !== null && p[1] !== undefined && isFinite(p[1])
                                                     && (!opts.log || floor > 0 || p[1] > 0));
  let body = "";
  if (!pts.length) {
    body = `<text x="${W / 2}" y="${H / 2}" text-anchor="middle">no data yet</text>`;
  } else {
    const tx = v => opts.log ? Math.log10(Math.max(Math.abs(v), floor)) : v;
    let x0 = Math.min(...pts.map(p => p[0])), x1 = Math.max(...pts.map(p => p[0]));
    let y0 = Math.min(...pts.map(p => tx(p[1]))), y1 = Math.max(...pts.map(p => tx(p[1])));
    if (opts.zero && !opts.log) y0 = Math.min(0, y0);
    if (x1 === x0) { x0 -= 1; x1 += 1; }
    // the least span: a decade on a log axis, opts.minSpan on a linear one, centred on the data
    const least = opts.log ? 1 : (opts.minSpan || 0);
    if (y1 - y0 < least) {
      const c = (y0 + y1) / 2;
      y0 = c - least / 2; y1 = c + least / 2;
      if (opts.log && floor > 0 && y0 < Math.log10(floor)) { y0 = Math.log10(floor); y1 = y0 + least; }
    }
    // a flat series: a little room around it, never below 0 on an axis from 0 (no "-1 B read")
    if (y1 === y0) { const d = Math.abs(y0) * 0.05 || 1; y0 = opts.zero && !opts.log ? Math.max(0, y0 - d) : y0 - d; y1 += d; }
    const sx = x => L + (x - x0) / (x1 - x0) * (W - L - R);
    const sy = y => T + (1 - (tx(y) - y0) / (y1 - y0)) * (H - T - B);
    const ylab = v => opts.format ? opts.format(v) : fmt(v);
    body += `<line x1="${L}" y1="${H - B}" x2="${W - R}" y2="${H - B}" stroke="#aaa"/>`
          + `<line x1="${L}" y1="${T}" x2="${L}" y2="${H - B}" stroke="#aaa"/>`;
    const ticks = [0, 0.5, 1].map(f => y0 + f * (y1 - y0));
    const labels = axisLabels(opts.log ? ticks.map(v => Math.pow(10, v)) : ticks,
                              opts.log ? logLabel : ylab);
    [0, 0.5, 1].forEach((f, i) => {
      const yy = T + (1 - f) * (H - T - B);
      body += `<text class="ylab" x="${L - 4}" y="${yy + 3}" text-anchor="end">${esc(labels[i])}</text>`
            + `<line x1="${L}" y1="${yy}" x2="${W - R}" y2="${yy}" stroke="#eee"/>`;
    });
    body += `<text x="${L}" y="${H - 6}">${esc(fmt(x0, 0))}</text>`
          + `<text x="${W - R}" y="${H - 6}" text-anchor="end">${esc(fmt(x1, 0))}</text>`
          + `<text x="${(L + W) / 2}" y="${H - 6}" text-anchor="middle">${esc(opts.xlabel || "iteration")}</text>`;
    body += `<polyline fill="none" stroke="${opts.color || COLORS[0]}" stroke-width="1.5" points="`
          + pts.map(p => `${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join(" ") + `"/>`;
    for (const p of pts) {
      const floored = opts.log && Math.abs(p[1]) < floor;
      body += `<circle class="pt ${cls}${floored ? " floored" : ""}" data-iteration="${p[0]}" data-value="${p[1]}" `
            + `cx="${sx(p[0]).toFixed(1)}" `
            + `cy="${sy(p[1]).toFixed(1)}" r="2.5" fill="${opts.color || COLORS[0]}">`
            + `<title>iteration ${p[0]}: ${esc((opts.tip || opts.format || (v => fmt(v, 6)))(p[1]))}</title></circle>`;
    }
  }
  return `<figure class="plot plot-${cls}" data-points="${pts.length}"><figcaption>${esc(title)}</figcaption>`
       + `<svg width="${W}" height="${H}" viewBox="0 0 ${W} ${H}">${body}</svg></figure>`;
}

// Stacked bars: seconds of each mode per iteration (<rect class="bar" data-mode data-iteration>).
function modePlot(its) {
  const W = 440, H = 170, L = 56, R = 8, T = 8, B = 22;
  const rows = its.filter(it => Array.isArray(it.mode_seconds));
  if (!rows.length) return linePlot("seconds per mode per iteration", [], [], "modes");
  const nmodes = Math.max(...rows.map(it => it.mode_seconds.length));
  const total = it => it.mode_seconds.reduce((a, b) => a + b, 0);
  // the run's first iteration includes compiling the kernels (seconds, against tens of
  // milliseconds after): it is drawn apart, cut at the others' scale and labelled, so that the
  // steady iterations use the plot's height
  const first = rows.length > 1 ? rows[0] : null;
  const top = Math.max(...(first ? rows.slice(1) : rows).map(total)) || 1;
  const x0 = rows[0].iteration, x1 = rows[rows.length - 1].iteration;
  const n = x1 - x0 + 1, bw = Math.max(1, (W - L - R) / n - 1);
  let body = `<line x1="${L}" y1="${H - B}" x2="${W - R}" y2="${H - B}" stroke="#aaa"/>`
           + `<text x="${L - 4}" y="${T + 3}" text-anchor="end">${esc(fmt(top))}</text>`
           + `<text x="${L - 4}" y="${H - B}" text-anchor="end">0</text>`
           + `<text x="${L}" y="${H - 6}">${x0}</text><text x="${W - R}" y="${H - 6}" text-anchor="end">${x1}</text>`
           + `<text x="${(L + W) / 2}" y="${H - 6}" text-anchor="middle">iteration (s, stacked by mode)</text>`;
  for (const it of rows) {
    let y = H - B;
    const x = L + (it.iteration - x0) / n * (W - L - R);
    const apart = it === first;
    const cut = apart && total(it) > top ? top / total(it) : 1;  // the first bar, cut to the height
    it.mode_seconds.forEach((s, m) => {
      const h = s * cut / top * (H - T - B);
      y -= h;
      const mk = it.mttkrp_seconds ? `, MTTKRP ${fmt(it.mttkrp_seconds[m])} s` : "";
      body += `<rect class="bar bar-mode${apart ? " bar-first" : ""}" data-iteration="${it.iteration}" data-mode="${m}" `
            + `data-value="${s}" x="${x.toFixed(1)}" y="${y.toFixed(1)}" width="${bw.toFixed(1)}" `
            + `height="${Math.max(0, h).toFixed(1)}" fill="${COLORS[m % COLORS.length]}"${apart ? ` fill-opacity="0.45"` : ""}>`
            + `<title>iteration ${it.iteration}, mode ${m}: ${fmt(s)} s${mk}${apart ? " (includes compilation)" : ""}</title></rect>`;
    });
    if (apart) {
      if (cut < 1) {  // a break mark where the bar is cut
        body += `<line x1="${x - 2}" y1="${T + 6}" x2="${x + bw + 2}" y2="${T + 2}" stroke="#fff" stroke-width="2"/>`;
      }
      body += `<text class="first-iteration" x="${(x + bw + 4).toFixed(1)}" y="${T + 9}" data-value="${total(it)}">`
            + `iteration ${it.iteration}: ${esc(fmt(total(it)))} s, includes compilation${cut < 1 ? " (cut)" : ""}</text>`;
    }
  }
  const legend = Array.from({length: nmodes}, (_, m) =>
    `<span style="color:${COLORS[m % COLORS.length]}">&#9632;</span> mode ${m}`).join(" ");
  return `<figure class="plot plot-modes" data-points="${rows.length}"><figcaption>seconds per mode per iteration `
       + `&nbsp; ${legend}</figcaption><svg width="${W}" height="${H}" viewBox="0 0 ${W} ${H}">${body}</svg></figure>`;
}

// The errors column: the first line of a failed, cancelled or lost run's error (cut to the column;
// all of it on hover, and unfolded on a click); a run that succeeded after earlier attempts were lost
// says so, in grey, not as an error; else how many errors its latest attempt logged.
const unfolded = new Set();  // runs whose error cell was clicked open (kept across polls)
function unfold(td) {
  const id = td.parentNode.dataset.runId;
  if (unfolded.has(id)) unfolded.delete(id); else unfolded.add(id);
  td.classList.toggle("unfolded", unfolded.has(id));
  td.textContent = unfolded.has(id) ? td.title : td.title.split("\n")[0];
}
function errorCell(r) {
  const line = String(r.error || "").split("\n")[0];
  if (line && ["failed", "cancelled", "lost"].includes(r.state)) {
    return `<td class="error-line${unfolded.has(r.run_id) ? " unfolded" : ""}" title="${esc(r.error)}" `
         + `onclick="unfold(this)">${esc(unfolded.has(r.run_id) ? r.error : line)}</td>`;
  }
  if (r.attempts > 1 && !r.errors) {  // a driver restarted after a lost worker: its earlier attempts
    const n = r.attempts - 1;
    const note = `attempt ${r.attempts}; ${n} earlier attempt${n > 1 ? "s" : ""} lost (see the run's earlier attempts)`;
    return `<td class="earlier" title="${esc(note)}">${esc(note)}</td>`;
  }
  return `<td class="num">${r.errors || ""}</td>`;
}

// When a run started: nothing for a queued one (waiting for a worker slot: it has not started, even
// when an earlier attempt had), its submission time on hover.
function startedCell(r) {
  if (r.state === "queued") {
    return `<td class="started" data-started="" title="submitted ${esc(r.created_at || "")}, not started"></td>`;
  }
  return `<td class="started" data-started="${esc(r.started_at || "")}" title="${esc(r.started_at || "")}">`
       + `${esc(since(r.started_at || r.created_at))}</td>`;
}

// The address of what is shown: the selected run, the runs table's page, the poll interval.
function pageQuery() {
  const q = new URLSearchParams();
  if (selected) q.set("run", selected);
  if (pageNo > 1) q.set("page", pageNo);
  if (LIMIT) q.set("limit", LIMIT);
  if (params.get("poll")) q.set("poll", POLL);
  return "?" + q.toString();
}

function goPage(n) {
  pageNo = Math.max(1, n);
  history.replaceState(null, "", pageQuery());
  poll();
  return false;
}

function mib(v) { return v ? (v / 1048576).toLocaleString(undefined, {maximumFractionDigits: 0}) + " MiB" : ""; }

// The queue of submitted runs waiting for a worker slot, and each worker's memory limit against
// the peak of the memory plan of the run it holds.
function renderCluster(data) {
  const queue = data.queue || [], workers = data.workers || [];
  let html = "";
  if (queue.length) {
    html += `<h2>queue</h2><table id="queue"><tr><th>#</th><th>run</th><th>workflow</th><th>waiting</th>`
          + `<th>held by worker</th></tr>`;
    for (const q of queue) {
      html += `<tr class="queue-row" data-run-id="${esc(q.run_id)}"><td class="num">${esc(q.position)}</td>`
            + `<td>${esc(q.run_id)}</td><td>${esc(q.workflow)}</td><td>${esc(duration(q.created_at))}</td>`
            + `<td>${esc(q.worker || "")}</td></tr>`;
    }
    html += `</table>`;
  } else {
    html += `<p class="meta" id="queue-empty">queue: no run waiting for a worker slot</p>`;
  }
  if (workers.length) {
    html += `<h2>workers</h2><table id="workers"><tr><th>worker</th><th>threads</th><th>tfooc slots</th>`
          + `<th>memory limit</th><th>memory now</th><th>plan peak</th><th>peak against the limit</th><th>runs</th></tr>`;
    for (const w of workers) {
      const BW = 160, lim = w.memory_limit, peak = w.plan_peak;
      const plan = w.plan || {};
      const usable = plan.required_limit ? plan.peak / plan.required_limit : null;
      let bar = "";
      if (lim) {
        bar = `<svg width="${BW}" height="12"><rect x="0" y="1" width="${BW}" height="10" fill="#eef0f3" stroke="#ccc"/>`
            + (peak ? `<rect class="peak-bar" data-value="${peak}" x="0" y="1" width="${Math.min(BW, peak / lim * BW).toFixed(1)}" `
                      + `height="10" fill="${peak > lim * (usable || 1) ? "#cf222e" : "#1a7f37"}"/>` : "")
            + (usable ? `<line x1="${(usable * BW).toFixed(1)}" y1="0" x2="${(usable * BW).toFixed(1)}" y2="12" stroke="#333">`
                        + `<title>usable: ${Math.round(usable * 100)} % of the limit</title></line>` : "")
            + `</svg>`;
      }
      const slots = w.slots === null || w.slots === undefined ? "none declared" : `${w.slots_used} of ${w.slots}`;
      html += `<tr class="worker-row" data-address="${esc(w.address)}" data-memory-limit="${lim || ""}" `
            + `data-plan-peak="${peak || ""}"><td>${esc(w.name)}</td><td class="num">${esc(w.nthreads)}</td>`
            + `<td>${esc(slots)}</td><td class="num">${mib(lim) || "unlimited"}</td><td class="num">${mib(w.memory)}</td>`
            + `<td class="num">${peak ? mib(peak) + (plan.step ? " (" + esc(plan.step) + ", " + esc(plan.execution || "") + ")" : "") : ""}</td>`
            + `<td>${bar}</td><td>${esc((w.runs || []).join(", "))}`
            + `${(w.waiting || []).length ? " · waiting: " + esc(w.waiting.join(", ")) : ""}</td></tr>`;
    }
    html += `</table>`;
  }
  document.getElementById("cluster").innerHTML = html;
}

function renderRuns(data) {
  document.getElementById("scheduler").textContent = data.scheduler ? "scheduler " + data.scheduler : "";
  const runs = data.runs || [];
  if (!selected && runs.length) selected = runs[0].run_id;
  if (!runs.length && data.total && data.page > 1) { goPage(data.pages); return; }  // past the last page
  if (!runs.length) {
    document.getElementById("runs").innerHTML = `<p class="empty">no runs yet: tfooc submit SPEC --scheduler `
      + `${esc(data.scheduler || "ADDRESS")} (or tfooc run SPEC --scheduler ...) and they appear here</p>`;
    return;
  }
  const first = (data.page - 1) * data.limit;
  const nav = `<nav class="pages" id="runs-pages" data-page="${data.page}" data-pages="${data.pages}" `
            + `data-total="${data.total}"><button class="newer" onclick="return goPage(${data.page - 1})"`
            + `${data.page > 1 ? "" : " disabled"}>&larr; newer</button><span class="meta">runs ${first + 1}`
            + `&ndash;${first + runs.length} of ${data.total}, newest first (page ${data.page} of ${data.pages})</span>`
            + `<button class="older" onclick="return goPage(${data.page + 1})"${data.page < data.pages ? "" : " disabled"}>`
            + `older &rarr;</button></nav>`;
  let html = `<h2>runs</h2><table id="runs-table"><colgroup><col style="width:19%"><col style="width:86px">`
           + `<col style="width:13%"><col style="width:9%"><col style="width:76px"><col style="width:120px">`
           + `<col style="width:112px"><col style="width:84px"><col></colgroup>`
           + `<tr><th>run</th><th>state</th><th>workflow</th><th>step</th>`
           + `<th>iterations</th><th>fit</th><th>started</th><th>duration</th><th>errors</th></tr>`;
  for (const r of runs) {
    html += `<tr class="run-row${r.run_id === selected ? " selected" : ""}" data-run-id="${esc(r.run_id)}" `
          + `data-state="${esc(r.state)}"><td><a href="?run=${encodeURIComponent(r.run_id)}" `
          + `onclick="return pick('${esc(r.run_id)}')">${esc(r.run_id)}</a></td><td>${badge(r.state)}</td>`
          + `<td>${esc(r.workflow)}</td><td>${esc(r.current_step || "")}</td><td class="num">${esc(r.iterations || "")}</td>`
          + (r.loglik !== null && r.loglik !== undefined
             ? `<td class="num loglik" title="log-likelihood (least-squares fit ${esc(fmt(r.fit, 6))})">`
               + `log-lik ${esc(sig(r.loglik))}</td>`
             : `<td class="num">${r.fit === null || r.fit === undefined ? "" : fmt(r.fit, 6)}</td>`)
          + startedCell(r) + `<td class="num">${r.state === "queued" ? "" : esc(duration(r.started_at, r.finished_at))}</td>`
          + errorCell(r) + `</tr>`;
  }
  document.getElementById("runs").innerHTML = html + "</table>" + nav;
}

function renderRun(v) {
  const el = document.getElementById("run");
  if (!v) { el.innerHTML = selected ? `<p class="empty">run ${esc(selected)} not found</p>` : ""; return; }
  el.dataset.runId = v.run_id;
  el.dataset.state = v.state;
  let html = `<h2>${esc(v.run_id)} ${badge(v.state)}</h2><div class="meta">${esc(v.workflow || "")} · `
           + `${esc(v.mode || "")} on ${esc(v.cluster || "")} · `
           + (v.state === "queued"
              ? `<span id="run-start">queued since ${esc(v.created_at || "")}, not started</span>`
              : `<span id="run-start">started ${esc(v.started_at || v.created_at || "")}</span> · `
                + `${esc(duration(v.started_at, v.finished_at))}`)
           + (v.attempt > 1 ? ` · attempt ${esc(v.attempt)}` : "") + ` · storage ${esc(v.storage || "?")}`
           + (v.dashboard ? ` · <a href="${esc(v.dashboard)}">dashboard</a>` : "") + `</div>`;
  const errs = v.errors || [], earlier = v.earlier_attempts || [];
  const entry = e => `<div class="error" data-attempt="${esc(e.attempt || "")}">${esc(e.time || "")} `
    + `${esc(e.step ? "[" + e.step + "] " : "")}${esc(e.message)}`
    + (e.traceback ? `<details><summary>traceback</summary><pre>${esc(e.traceback)}</pre></details>` : "") + `</div>`;
  // a run that succeeded has no error of its own: what its attempts logged is a note, in grey
  const succeeded = v.state === "done" || v.state === "skipped";
  if (v.error || errs.length) {
    html += succeeded
      ? `<div class="note" id="logged-errors"><b>errors logged by the attempt that succeeded</b>`
      : `<div class="errors" id="errors"><b>errors</b>` + (v.error ? `<div>${esc(v.error)}</div>` : "");
    html += errs.map(entry).join("") + `</div>`;
  }
  if (earlier.length) {
    html += `<div class="note" id="earlier-attempts"><b>earlier attempts</b> <span class="meta">(before attempt `
          + `${esc(v.attempt)}, which ${succeeded ? "succeeded" : "is the run's latest"})</span>`
          + earlier.map(entry).join("") + `</div>`;
  }
  html += `<table id="steps"><tr><th>step</th><th>kind</th><th>state</th><th>seconds</th><th>result</th></tr>`;
  for (const [name, st] of Object.entries(v.steps || {})) {
    const m = st.metrics || {};
    const bits = [];
    if (m.loglik !== undefined && m.loglik !== null) bits.push("log-likelihood " + exp8(m.loglik));
    if (m.kkt_violation !== undefined && m.kkt_violation !== null) bits.push("KKT violation " + fmt(m.kkt_violation, 2));
    if (m.fit !== undefined) bits.push((m.loglik !== undefined ? "least-squares fit " : "fit ") + fmt(m.fit, 6));
    if (m.fms !== undefined) bits.push("factor match " + fmt(m.fms, 4));
    if (m.iterations !== undefined) bits.push(m.iterations + " iterations");
    if (m.nnz !== undefined) bits.push(Number(m.nnz).toLocaleString() + " nonzeros");
    if (st.error) bits.push(st.state === "done" ? "earlier attempt: " + st.error : st.error);
    html += `<tr data-step="${esc(name)}"><td>${esc(name)}</td><td>${esc(st.kind || "")}</td><td>${badge(st.state)}</td>`
          + `<td class="num">${st.seconds === null || st.seconds === undefined ? "" : fmt(st.seconds, 1)}</td>`
          + `<td class="wrap">${esc(bits.join("; "))}</td></tr>`;
  }
  html += `</table>`;
  for (const [step, its] of Object.entries(v.iterations || {})) {
    const last = its[its.length - 1] || {};
    const x = its.map(it => it.iteration);
    let cum = 0;
    const cumBytes = its.map(it => (cum += (it.bytes_read || 0)));
    const steady = its.slice(1).length ? its.slice(1) : its;
    const perIt = steady.reduce((a, it) => a + (it.seconds || 0), 0) / Math.max(1, steady.length);
    // a CP-APR (Poisson) step: its iterations carry the log-likelihood, not a fit change
    const poisson = its.some(it => it.loglik !== undefined && it.loglik !== null);
    const has = f => its.some(it => it[f] !== undefined && it[f] !== null);
    const llSpan = LOGLIK_SPAN * Math.max(1, ...its.map(it => Math.abs(it.loglik || 0)));
    const head = poisson
      ? `${esc(step)}: outer iteration ${esc(last.iteration)}${last.max_iters ? " of at most " + last.max_iters : ""} · `
        + `log-likelihood ${exp8(last.loglik)} · change ${fmt(last.loglik_change, 2)} · `
        + `KKT violation ${fmt(last.kkt_violation, 2)} · least-squares fit ${fmt(last.fit, 6)} · `
        + `${fmt(perIt, 3)} s per iteration (steady state)`
        + (its.length > 1 ? ` · first iteration ${fmt(its[0].seconds, 2)} s (includes compilation)` : "")
        + (has("nnz_per_s") ? ` · ${fmt((last.nnz_per_s || 0) / 1e6, 1)} M nonzero-modes/s` : "")
        + (has("bytes_read") ? ` · ${bytes(cum)} read` : "")
      : `${esc(step)}: iteration ${esc(last.iteration)}${last.max_iters ? " of at most " + last.max_iters : ""} · `
        + `fit ${fmt(last.fit, 6)} · change ${fmt(last.fit_change, 2)} · ${fmt(perIt, 3)} s per iteration `
        + `(steady state)` + (its.length > 1 ? ` · first iteration ${fmt(its[0].seconds, 2)} s (includes compilation)` : "")
        + ` · ${fmt((last.nnz_per_s || 0) / 1e6, 1)} M nonzero-modes/s · ${bytes(cum)} read`;
    const progressPlots = poisson
      ? linePlot("log-likelihood (Poisson)", x, its.map(it => it.loglik), "pt-loglik",
                 {format: sig, tip: exp8, minSpan: llSpan, xlabel: "outer iteration"})
        + linePlot(`KKT violation (log scale; below ${fmt(CHANGE_FLOOR, 0)} drawn at it)`, x,
                   its.map(it => it.kkt_violation), "pt-kkt",
                   {log: true, floor: CHANGE_FLOOR, color: COLORS[1], xlabel: "outer iteration"})
        + (has("mode_seconds") ? modePlot(its)
           : linePlot("seconds per outer iteration", x, its.map(it => it.seconds), "pt-seconds",
                      {zero: true, color: COLORS[5], format: v => fmt(v, 3) + " s", xlabel: "outer iteration"}))
      : linePlot("fit", x, its.map(it => it.fit), "pt-fit", {format: v => fmt(v, 6), minSpan: FIT_SPAN})
        + linePlot(`|fit change| (log scale; below ${fmt(CHANGE_FLOOR, 0)} drawn at it)`, x, its.map(it => it.fit_change),
                   "pt-fit-change", {log: true, floor: CHANGE_FLOOR, color: COLORS[1]})
        + modePlot(its);
    html += `<div class="step-plots${poisson ? " poisson" : ""}" data-step="${esc(step)}" data-iterations="${its.length}">`
          + `<h3>${head}</h3>`
          + `<div class="plots">`
          + progressPlots
          + (!poisson || has("nnz_per_s")
             ? linePlot("nonzeros per second (nonzero-modes/s)", x, its.map(it => it.nnz_per_s), "pt-nnz-per-s",
                        {zero: true, color: COLORS[2], format: v => fmt(v / 1e6, 1) + " M"})
             : "")
          + (!poisson || has("bytes_read")
             ? linePlot("bytes read from the store (cumulative)", x, cumBytes, "pt-bytes-read",
                        {zero: true, color: COLORS[4], format: bytes})
             : "")
          + (its.some(it => it.bytes_sent !== undefined && it.bytes_sent !== null)
             ? linePlot(`bytes sent between ${last.workers || ""} workers per iteration (lower bound `
                        + `${bytes(last.bytes_lower_bound || 0)})`, x, its.map(it => it.bytes_sent), "pt-bytes-sent",
                        {zero: true, color: COLORS[3], format: bytes})
             : "")
          + `</div>`;
    const cps = (v.checkpoints || []).filter(c => c.step === step);
    const ncp = (v.checkpoint_count || {})[step] || cps.length;
    if (cps.length) {
      html += `<h3>checkpoints (${ncp} written; the latest ${Math.min(8, cps.length)})</h3><table class="checkpoints">`
            + `<tr><th>iteration</th><th>written at</th><th>seconds</th></tr>`;
      for (const c of cps.slice(-8).reverse()) {
        html += `<tr class="checkpoint"><td class="num">${esc(c.iteration)}</td><td>${esc(c.time)}</td>`
              + `<td class="num">${fmt(c.seconds, 4)}</td></tr>`;
      }
      html += `</table>`;
    }
    html += `</div>`;
  }
  el.innerHTML = html;
}

function pick(runId) {
  selected = runId;
  history.replaceState(null, "", pageQuery());
  poll();
  return false;
}

async function getJSON(url) {
  const r = await fetch(url, {cache: "no-store"});
  if (!r.ok && r.status !== 404) throw new Error(url + ": HTTP " + r.status);
  return r.status === 404 ? null : r.json();
}

async function poll() {
  if (polling) return;
  polling = true;
  try {
    const data = await getJSON(BASE + "/runs.json?page=" + pageNo + (LIMIT ? "&limit=" + LIMIT : ""));
    renderRuns(data);
    renderCluster(data);
    renderRun(selected ? await getJSON(BASE + "/runs/" + encodeURIComponent(selected) + ".json") : null);
    document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
    document.body.dataset.state = "ready";
  } catch (e) {
    document.getElementById("updated").textContent = "update failed: " + e.message;
  } finally {
    polling = false;
  }
}
poll();
setInterval(poll, POLL);
</script>
</body>
</html>
"""
