// /demo: the live console over schedules, jobs, events and the CPU pool, and its four charts.
"use strict";

(() => {
  const { api, poll, el, replaceRows, morph, patch } = mega;
  const $ = (id) => document.getElementById(id);
  const dash = (v) => (v === null || v === undefined ? "-" : String(v));
  const time = (iso) => iso.slice(11, 19);

  function panel(name, part) {
    const alert = $("panel-" + name).querySelector("[data-unavailable]");
    alert.hidden = !part || part.ok;
    if (part && !part.ok) alert.textContent = part.error;
    return part && part.ok;
  }

  // ---- charts: inline SVG, drawn in a 600 x 100 box that the CSS stretches to the card ----
  const W = 600;
  const H = 100;
  const TOP = 6; // room above the highest point
  const SVG = "http://www.w3.org/2000/svg";

  function svg(tag, attrs, ...children) {
    const node = document.createElementNS(SVG, tag);
    for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, value);
    for (const child of children) node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    return node;
  }

  // 1, 2 or 5 times a power of ten, at or above `v`: a y-axis top a person can read.
  function niceMax(v) {
    if (!(v > 0)) return 1;
    const power = 10 ** Math.floor(Math.log10(v));
    for (const m of [1, 2, 5, 10]) if (m * power >= v) return m * power;
    return 10 * power;
  }

  const round = (v) => (v >= 100 ? Math.round(v) : Math.round(v * 10) / 10);
  const num = (v) => String(Math.round(v * 100) / 100);

  function scales(window, ymax) {
    const span = window.end_ms - window.start_ms || 1;
    const x = (t) => round(Math.max(0, Math.min(W, ((t - window.start_ms) / span) * W)));
    const y = (v) => round(H - (Math.min(v, ymax) / ymax) * (H - TOP));
    return { x, y };
  }

  // One flat segment per step, joined where steps touch: bucketed data, drawn as what it is.
  function stepPath(points, stepMs, end, { x, y }) {
    let d = "";
    let joinAt = null;
    for (const [t, v] of points) {
      d += (joinAt === t ? `V${y(v)}` : `M${x(t)} ${y(v)}`) + `H${x(Math.min(t + stepMs, end))}`;
      joinAt = t + stepMs;
    }
    return d;
  }

  // The area under a step line whose steps all touch (jobs per second has a point per step).
  function areaPath(points, stepMs, end, { x, y }) {
    if (!points.length) return "";
    const steps = points.map(([t, v]) => `V${y(v)}H${x(Math.min(t + stepMs, end))}`).join("");
    return `M${x(points[0][0])} ${H}${steps}V${H}Z`;
  }

  // A level sampled now and then (the DLQ size): each sample holds until the next, the last until now.
  function holdPath(points, end, { x, y }) {
    return points.map(([t, v], i) => `${i ? "V" : "M" + x(t) + " "}${y(v)}H${x(i + 1 < points.length ? points[i + 1][0] : end)}`).join("");
  }

  // One bar per event (a tick).
  const barPath = (points, { x, y }) => points.map(([t, v]) => `M${x(t)} ${H}V${Math.min(y(v), H - 2)}`).join("");

  function plot(label, ymaxText, lines) {
    return el("div", { class: "chart-plot", "data-plot": "" },
      el("span", { class: "chart-ymax muted small", "aria-hidden": "true" }, ymaxText),
      svg("svg", { viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none", role: "img", "aria-label": label, focusable: "false" },
        svg("title", {}, label),
        svg("path", { class: "chart-grid", d: `M0 ${H - 0.5}H${W}M0 ${TOP}H${W}` }),
        ...lines.map(([cls, d]) => svg("path", { class: cls, d: d || "M0 0" }))));
  }

  // Update one chart card in place (mega.morph keeps the nodes, so nothing flickers).
  function drawChart(id, { latest, empty, plot: fresh }) {
    const card = $("chart-" + id);
    card.querySelector("[data-latest]").textContent = latest;
    card.querySelector("[data-empty]").hidden = !empty;
    for (const part of card.querySelectorAll(".chart-axis, .chart-legend")) part.hidden = empty;
    const old = card.querySelector("[data-plot]");
    const next = morph(old, fresh);
    next.hidden = empty;
  }

  const peak = (points) => points.reduce((m, [, v]) => Math.max(m, v), 0);
  const last = (points) => (points.length ? points[points.length - 1][1] : null);

  function renderCharts(s) {
    const w = s.window;
    const stepMs = w.step_s * 1000;
    const totals = s.totals;

    {
      const top = niceMax(peak(s.jobs_per_s));
      const sc = scales(w, top);
      const latest = last(s.jobs_per_s);
      const line = stepPath(s.jobs_per_s, stepMs, w.end_ms, sc);
      const area = areaPath(s.jobs_per_s, stepMs, w.end_ms, sc);
      const label = `Jobs finished per second over the last 10 minutes: ${num(latest)} per second now, peak ${num(peak(s.jobs_per_s))}, ${totals.jobs_done} jobs in all.`;
      drawChart("jobs", {
        latest: `${num(latest)}/s · ${totals.jobs_done} done`,
        empty: totals.jobs_done === 0,
        plot: plot(label, `${num(top)}/s`, [["chart-area", area], ["chart-line", line]]),
      });
    }
    {
      const top = niceMax(peak(s.start_p99_ms));
      const sc = scales(w, top);
      const p50 = last(s.start_p50_ms);
      const p99 = last(s.start_p99_ms);
      const latest = p50 === null ? "-" : `p50 ${num(p50)} ms · p99 ${num(p99)} ms`;
      const label = p50 === null
        ? "Enqueue to start latency: no job started in the last 10 minutes."
        : `Enqueue to start latency over the last 10 minutes, latest step: p50 ${num(p50)} ms, p99 ${num(p99)} ms; highest p99 ${num(peak(s.start_p99_ms))} ms.`;
      drawChart("latency", {
        latest,
        empty: totals.starts === 0,
        plot: plot(label, `${num(top)} ms`, [
          ["chart-line chart-line-2", stepPath(s.start_p99_ms, stepMs, w.end_ms, sc)],
          ["chart-line", stepPath(s.start_p50_ms, stepMs, w.end_ms, sc)],
        ]),
      });
    }
    {
      const top = niceMax(peak(s.dlq));
      const sc = scales(w, top);
      const latest = last(s.dlq);
      const label = latest === null
        ? "DLQ size: not sampled yet."
        : `DLQ size over the last 10 minutes: ${latest} now, at most ${peak(s.dlq)}.`;
      drawChart("dlq", {
        latest: dash(latest),
        empty: peak(s.dlq) === 0,
        plot: plot(label, String(top), [["chart-line chart-line-bad", holdPath(s.dlq, w.end_ms, sc)]]),
      });
    }
    {
      const top = niceMax(peak(s.tick_lateness_ms));
      const sc = scales(w, top);
      const latest = last(s.tick_lateness_ms);
      const label = latest === null
        ? "Tick lateness: no scheduled tick in the last 10 minutes."
        : `Tick lateness over the last 10 minutes: the latest tick started ${num(latest)} ms after its instant; the worst of ${totals.ticks} ticks, ${num(peak(s.tick_lateness_ms))} ms.`;
      drawChart("lateness", {
        latest: latest === null ? "-" : `${num(latest)} ms`,
        empty: totals.ticks === 0,
        plot: plot(label, `${num(top)} ms`, [["chart-bars", barPath(s.tick_lateness_ms, sc)]]),
      });
    }
  }

  // ---- panels ----
  function render(data) {
    const s = data.schedules;
    if (panel("schedules", s)) {
      $("sched-instances").textContent = s.instances.length;
      // The rows of the admin's macros (mega/web/templates/admin/_tables.html), in this page's classes.
      replaceRows($("sched-instance-list").tBodies[0], s.instances.map((i) =>
        el("tr", { "data-key": i.instance },
          el("td", { class: "mono small", title: i.instance }, i.short),
          el("td", { class: "num mono small" }, el("time", { datetime: i.utc }, i.time)),
          el("td", {}, el("span", { class: "badge " + (i.ticking ? "badge-ok" : "badge-warn") }, i.ticking ? "ticking" : "silent")))), null);
      $("sched-instance-list").hidden = s.instances.length === 0;
      const sourceBadge = { manual: "badge-info", pause: "badge-warn", resume: "badge-ok" };
      replaceRows($("sched-ticks").tBodies[0], s.ticks.map((t) =>
        el("tr", { "data-key": `${t.source} ${t.instant}` },
          el("td", { class: "mono small" }, el("time", { datetime: t.utc }, t.time)),
          el("td", {}, el("span", { class: "badge " + (sourceBadge[t.source] || "") }, t.source)),
          el("td", { class: "mono small", title: t.winner || "" }, t.winner_short || "none"),
          el("td", {}, ...(t.skipped.length
            ? t.skipped.map((k) => el("div", {}, el("span", { class: "mono small", title: k.instance }, k.short), `: ${k.reason}`))
            : [el("span", { class: "muted" }, "—")])))), $("sched-empty"));
    }
    const j = data.jobs;
    if (panel("jobs", j)) {
      $("jobs-pending").textContent = dash(j.pending);
      $("jobs-inflight").textContent = dash(j.in_flight);
      $("jobs-dlq").textContent = dash(j.dlq);
      $("jobs-p50").textContent = j.start_latency_p50_ms === null ? "-" : j.start_latency_p50_ms + " ms";
    }
    const w = data.workers;
    if (w && w.ok) {
      replaceRows($("worker-instances").tBodies[0], w.instances.map((i) =>
        el("tr", { "data-key": i.instance },
          el("td", { class: "mono small", title: i.instance }, i.short),
          el("td", { class: "num" }, String(i.running)),
          el("td", { class: "num" }, String(i.done)),
          el("td", { class: "num mono" }, time(i.last_seen)))), $("worker-empty"));
    }
    const e = data.events;
    if (panel("events", e)) {
      $("events-outbox").textContent = e.outbox_pending;
      $("events-lag").textContent = Math.round(e.lag_ms) + " ms";
      patch($("events-groups").tBodies[0], e.groups.map((g) =>
        el("tr", { "data-key": g.group },
          el("td", { class: "mono small" }, g.group),
          el("td", { class: "num" }, g.pending),
          el("td", { class: "num" }, g.dlq))));
    }
    const p = data.pool;
    if (panel("pool", p)) {
      for (const key of ["busy", "queued", "size", "restarts"]) $("pool-" + key).textContent = p[key];
    }
    const series = data.series;
    const unavailable = $("charts-unavailable");
    unavailable.hidden = !series || series.ok;
    if (series && !series.ok) unavailable.textContent = series.error;
    if (series && series.ok) renderCharts(series);
  }

  poll(async () => {
    const envelope = await api("GET", "/api/demo/console");
    if (envelope.ok) render(envelope.data);
    return envelope.ok;
  }, 2000);
})();
