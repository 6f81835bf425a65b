// /demo/cron: keep the counter, history, audit and next runs live (keyed rows, patched in place);
// "Run now" with an optional hold, without a reload.
"use strict";

(() => {
  const { api, poll, el, patch, replaceRows, typed, fieldErrors } = mega;
  const $ = (id) => document.getElementById(id);
  const FENCE_TITLE = "the run's fencing number: at least the planned instant in epoch ms";

  function historyRow(item) {
    return el("tr", { "data-key": item.at + "|" + item.source + "|" + item.fence },
      el("td", { class: "mono", title: item.at }, item.at.slice(0, 10) + " " + item.at.slice(11, 19)),
      el("td", {}, el("span", { class: item.source === "manual" ? "badge badge-info" : "badge" }, item.source)));
  }

  function tickRow(tick) {
    return el("tr", { "data-key": tick.instant + "|" + tick.source },
      el("td", { class: "mono" }, tick.instant.slice(11, 19) + " ",
        tick.source === "manual" ? el("span", { class: "badge badge-info" }, "manual") : null),
      el("td", { class: "mono small wrap-id", title: tick.winner }, tick.winner_label || "none"),
      el("td", { class: "small wrap-id" }, ...(tick.skipped.length
        ? tick.skipped.map((s) => el("div", {}, el("span", { class: "mono", title: s.instance }, s.label), ": " + s.reason))
        : [el("span", { class: "muted" }, "-")])),
      el("td", { class: "num mono small", title: FENCE_TITLE }, tick.fence === null ? "-" : String(tick.fence)),
      el("td", { class: "num" }, tick.lateness_ms === null ? "-" : tick.lateness_ms.toFixed(1) + " ms"));
  }

  function schedulerItem(s) {
    return el("li", { "data-key": s.instance }, el("span", { class: "mono", title: s.instance }, s.label),
      ...(s.pid ? [": stop it with ", el("code", {}, "kill " + s.pid)] : []));
  }

  function render(state) {
    $("count").textContent = state.count;
    $("next-run").textContent = state.next_runs.length ? state.next_runs[0].slice(11, 19) : "-";
    replaceRows($("history").tBodies[0], state.history.map(historyRow), $("history-empty"));
    replaceRows($("ticks").tBodies[0], state.ticks.map(tickRow), $("ticks-empty"));
    patch($("schedulers"), state.schedulers.map(schedulerItem));
    patch($("next-runs"), state.next_runs.map((at) => el("li", { "data-key": at }, at)));
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
        " (" + data.hold_ms + " ms): watch the next tick in the audit.";
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

  poll(load, 2000);
})();
