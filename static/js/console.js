// /demo: the live console over schedules, jobs, events and the CPU pool.
"use strict";

(() => {
  const { api, poll, el, replaceRows } = mega;
  const $ = (id) => document.getElementById(id);
  const dash = (v) => (v === null || v === undefined ? "-" : String(v));

  function panel(name, part) {
    const alert = $("panel-" + name).querySelector("[data-unavailable]");
    alert.hidden = !part || part.ok;
    if (part && !part.ok) alert.textContent = part.error;
    return part && part.ok;
  }

  function render(data) {
    const s = data.schedules;
    if (panel("schedules", s)) {
      $("sched-instances").textContent = s.instances.length;
      $("sched-instance-list").replaceChildren(...s.instances.map((i) => el("li", {}, i.instance)));
      replaceRows($("sched-ticks").tBodies[0], s.ticks.map((t) =>
        el("tr", {},
          el("td", { class: "mono" }, t.instant.slice(11, 19)),
          el("td", { class: "mono small" }, t.winner || "none"),
          el("td", { class: "num" }, t.skipped.length))), $("sched-empty"));
    }
    const j = data.jobs;
    if (panel("jobs", j)) {
      $("jobs-pending").textContent = dash(j.pending);
      $("jobs-inflight").textContent = dash(j.in_flight);
      $("jobs-dlq").textContent = dash(j.dlq);
      $("jobs-p50").textContent = j.start_latency_p50_ms === null ? "-" : j.start_latency_p50_ms + " ms";
    }
    const e = data.events;
    if (panel("events", e)) {
      $("events-outbox").textContent = e.outbox_pending;
      $("events-lag").textContent = Math.round(e.lag_ms) + " ms";
      replaceRows($("events-groups").tBodies[0], e.groups.map((g) =>
        el("tr", {},
          el("td", { class: "mono small" }, g.group),
          el("td", { class: "num" }, g.pending),
          el("td", { class: "num" }, g.dlq))));
    }
    const p = data.pool;
    if (panel("pool", p)) {
      for (const key of ["busy", "queued", "size", "restarts"]) $("pool-" + key).textContent = p[key];
    }
  }

  poll(async () => {
    const envelope = await api("GET", "/api/demo/console");
    if (envelope.ok) render(envelope.data);
    return envelope.ok;
  }, 2000);
})();
