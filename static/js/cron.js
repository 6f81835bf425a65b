// /demo/cron: keep the counter, history, audit and next runs live; "Run now" without a reload.
"use strict";

(() => {
  const { api, poll, el, replaceRows } = mega;
  const $ = (id) => document.getElementById(id);

  function render(state) {
    $("count").textContent = state.count;
    $("next-run").textContent = state.next_runs.length ? state.next_runs[0].slice(11, 19) : "-";
    replaceRows(
      $("history").tBodies[0],
      state.history.map((item) =>
        el("tr", {},
          el("td", { class: "mono", title: item.at }, item.at.slice(0, 10) + " " + item.at.slice(11, 19)),
          el("td", {}, el("span", { class: item.source === "manual" ? "badge badge-info" : "badge" }, item.source)))),
      $("history-empty"));
    replaceRows(
      $("ticks").tBodies[0],
      state.ticks.map((tick) =>
        el("tr", {},
          el("td", { class: "mono" }, tick.instant.slice(11, 19) + " ",
            tick.source === "manual" ? el("span", { class: "badge badge-info" }, "manual") : null),
          el("td", { class: "mono small" }, tick.winner || "none"),
          el("td", { class: "small" }, ...(tick.skipped.length
            ? tick.skipped.map((s) => el("div", {}, el("span", { class: "mono" }, s.instance), ": " + s.reason))
            : [el("span", { class: "muted" }, "-")])),
          el("td", { class: "num mono small", title: "the run's fencing number: at least the planned instant in epoch ms" },
            tick.fence === null ? "-" : String(tick.fence)),
          el("td", { class: "num" }, tick.lateness_ms === null ? "-" : tick.lateness_ms.toFixed(1) + " ms"))),
      $("ticks-empty"));
    $("next-runs").replaceChildren(...state.next_runs.map((at) => el("li", {}, at)));
  }

  async function load() {
    const envelope = await api("GET", "/api/demo/cron");
    if (envelope.ok) render(envelope.data);
    return envelope.ok;
  }

  $("run-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const button = $("run-now");
    button.disabled = true;
    try {
      const envelope = await api("POST", "/api/demo/cron/run");
      const result = $("run-result");
      if (!envelope.ok) result.textContent = envelope.error.message;
      else if (envelope.data.ran) result.textContent = "Manual tick ran.";
      else result.textContent = "Manual tick skipped: " + envelope.data.reason;
      await load();
    } finally {
      button.disabled = false;
    }
  });

  poll(load, 2000);
})();
