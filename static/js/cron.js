// /demo/cron: keep the counter, history, audit and next runs live (keyed rows, patched in place);
// "Run now" with an optional hold, and pause or resume, without a reload.
"use strict";

(() => {
  const { api, poll, el, patch, replaceRows, typed, fieldErrors } = mega;
  const $ = (id) => document.getElementById(id);
  const FENCE_TITLE = "the run's fencing number: at least the planned instant in epoch ms";
  const LATE_TITLE = "how late the run started against the planned instant";

  function historyRow(item) {
    return el("tr", { "data-key": item.at + "|" + item.source + "|" + item.fence },
      el("td", { class: "mono", title: item.at }, item.at.slice(0, 10) + " " + item.at.slice(11, 19)),
      el("td", {}, el("span", { class: item.source === "manual" ? "badge badge-info" : "badge" }, item.source)));
  }

  // The audit's rows that are no planned tick: a manual one, and a pause or a resume.
  const SOURCE_BADGES = { manual: "badge-info", pause: "badge-warn", resume: "badge-ok" };

  function tickRow(tick) {
    const change = tick.source === "pause" || tick.source === "resume";
    return el("tr", { "data-key": tick.instant + "|" + tick.source },
      el("td", {}, el("span", { class: "mono" }, tick.instant.slice(11, 19)),
        ...(tick.source !== "schedule" ? [" ", el("span", { class: "badge " + SOURCE_BADGES[tick.source] }, tick.source)] : []),
        tick.lateness_ms === null ? null : el("div", { class: "small muted", title: LATE_TITLE }, tick.lateness_ms.toFixed(1) + " ms late")),
      el("td", { class: "small" }, change ? el("span", { class: "muted" }, "-")
        : el("span", { class: "mono", title: tick.winner }, tick.winner_label || "none"),
        tick.fence === null ? null : el("div", { class: "mono muted fence", title: FENCE_TITLE }, String(tick.fence))),
      el("td", { class: "small" }, ...(tick.skipped.length
        ? tick.skipped.map((s) => el("div", {}, el("span", { class: "mono", title: s.instance }, s.label), ": " + s.reason))
        : [el("span", { class: "muted" }, "-")])));
  }

  function schedulerItem(s) {
    return el("li", { "data-key": s.instance }, el("span", { class: "mono", title: s.instance }, s.label),
      ...(s.pid ? [": stop it with ", el("code", {}, "kill " + s.pid)] : []));
  }

  // A next run: its UTC time (the page's one zone), and the same instant in the schedule's zone.
  function nextRunItem(at, i, utc, zone) {
    return el("li", { "data-key": at }, el("time", { datetime: utc[i] }, utc[i].slice(11, 19) + " UTC"), " ",
      el("span", { class: "muted", title: at }, "(" + at.slice(11, 19) + " " + zone + ")"));
  }

  // A scroll box as tall as the whole rows that fit in its CSS max-height (header included), so
  // that at rest it never shows half a row. The rows' heights vary (a tick with two skips is
  // taller), so it is measured after each render and on resize.
  function fitRows(box) {
    if (!box.dataset.limit) box.dataset.limit = String(parseFloat(getComputedStyle(box).maxHeight));
    const table = box.querySelector("table");
    let height = table.tHead ? table.tHead.getBoundingClientRect().height : 0;
    for (const row of table.tBodies[0].rows) {
      const next = height + row.getBoundingClientRect().height;
      if (next > Number(box.dataset.limit)) {
        box.style.maxHeight = Math.ceil(height) + "px";
        return;
      }
      height = next;
    }
    box.style.maxHeight = ""; // everything fits: no scroll
  }
  const boxes = () => [$("history-box"), $("ticks-box")];

  // The pause line and its one button, which pauses or resumes (the form's action says which).
  function renderPause(pause) {
    const form = $("pause-form");
    form.dataset.paused = String(pause.paused);
    form.action = "/demo/cron/" + (pause.paused ? "resume" : "pause");
    $("pause-badge").className = "badge " + (pause.paused ? "badge-warn" : "badge-ok");
    $("pause-badge").textContent = pause.paused ? "paused" : "ticking";
    $("pause-state").textContent = pause.text;
    $("pause-button").className = "btn " + (pause.paused ? "btn-primary" : "btn-warn");
    $("pause-button").textContent = pause.paused ? "Resume" : "Pause";
  }

  function render(state) {
    const first = state.next_runs.length > 0;
    renderPause(state.pause);
    $("count").textContent = state.count;
    $("next-run").textContent = first ? state.next_runs_utc[0].slice(11, 19) + " UTC" : "-";
    $("next-run-zone").textContent = first ? ", " + state.next_runs[0].slice(11, 19) + " " + state.timezone : "";
    replaceRows($("history").tBodies[0], state.history.map(historyRow), $("history-empty"));
    replaceRows($("ticks").tBodies[0], state.ticks.map(tickRow), $("ticks-empty"));
    patch($("schedulers"), state.schedulers.map(schedulerItem));
    patch($("next-runs"), state.next_runs.map((at, i) => nextRunItem(at, i, state.next_runs_utc, state.timezone)));
    boxes().forEach(fitRows);
  }

  async function load() {
    const envelope = await api("GET", "/api/demo/cron");
    if (envelope.ok) render(envelope.data);
    return envelope.ok;
  }

  function outcome(data) {
    if (!data.ran) return "Manual tick skipped: " + data.reason + ".";
    if (data.error) return "Manual tick ran and failed: " + data.error;
    if (data.hold_ms) {
      return "Manual tick ran and holds the overlap guard until " + data.hold_until.slice(11, 19) +
        " UTC (" + data.hold_ms + " ms): watch the next tick in the audit.";
    }
    return "Manual tick ran.";
  }

  const errors = fieldErrors($("run-form"));

  $("run-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const button = $("run-now");
    const result = $("run-result");
    button.disabled = true;
    result.textContent = "";
    try {
      const envelope = await api("POST", "/api/demo/cron/run", { hold_ms: typed($("hold-ms"), 0) });
      result.textContent = envelope.ok ? outcome(envelope.data) : errors.show(envelope.error);
      await load();
    } finally {
      button.disabled = false;
    }
  });

  $("pause-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const button = $("pause-button");
    const paused = $("pause-form").dataset.paused === "true";
    button.disabled = true;
    try {
      const envelope = await api("POST", "/api/demo/cron/" + (paused ? "resume" : "pause"));
      if (envelope.ok) renderPause(envelope.data);
      else $("pause-state").textContent = envelope.error.message;
      await load();
    } finally {
      button.disabled = false;
    }
  });

  boxes().forEach(fitRows);
  window.addEventListener("resize", () => boxes().forEach(fitRows));
  poll(load, 2000);
})();
