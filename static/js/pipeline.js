// /demo/jobs, the pipeline panel: a run resizes a photo to a few sizes at once (a group), then
// publishes it once (its callback). Each member's box and the callback's are patched in place
// every 300 ms until the workflow ends; then the table shows what the callback received.
"use strict";

(() => {
  const { api, el, patch, typed, fieldErrors } = mega;
  const $ = (id) => document.getElementById(id);
  const BADGES = { done: "badge-ok", dlq: "badge-bad", running: "badge-info", retrying: "badge-warn", cancelled: "badge-warn" };
  const errors = fieldErrors($("pipeline-form"));
  let current = null; // the run being drawn

  function badge(state) {
    return el("span", { class: "badge " + (BADGES[state] || "") }, state);
  }

  function member(m) {
    return el("li", { class: "pipeline-step", "data-key": String(m.size), "data-state": m.state },
      el("b", {}, m.size + " px"), " ", badge(m.state));
  }

  // A path that may wrap after each "/" on a narrow screen, never inside a name.
  function path(url) {
    const parts = url.split("/");
    return parts.flatMap((part, i) => (i < parts.length - 1 ? [part + "/", el("wbr")] : [part]));
  }

  function outcome(o, n) {
    const detail = o.state === "done" ? path(o.result.url) : o.error ? [o.error.type + ": " + o.error.message] : [];
    return el("tr", { "data-key": o.id },
      el("th", { scope: "row" }, String(n + 1)),
      el("td", {}, badge(o.state)),
      el("td", { class: "pipeline-detail" }, ...detail));
  }

  function render(data) {
    patch($("pipeline-steps"), data.members.map(member));
    const runs = data.callback_runs === 1 ? "ran once" : "ran " + data.callback_runs + " times";
    patch($("pipeline-callback"), [
      el("b", {}, "PublishJob"), badge(data.callback.state),
      el("span", { class: "muted small", id: "pipeline-runs" }, data.callback_runs ? runs : "waits for every member"),
    ]);
    $("pipeline-flow").hidden = false;
    $("pipeline-empty").hidden = true;
    const received = data.results || [];
    patch($("pipeline-received"), received.map(outcome));
    $("pipeline-table").hidden = received.length === 0;
    return data.state !== "running" && data.callback_runs > 0;
  }

  async function follow(run) {
    if (run !== current) return; // a newer run took over
    const envelope = await api("GET", "/api/demo/workflows/" + run);
    if (!envelope.ok) {
      $("pipeline-status").textContent = envelope.error.message;
      return;
    }
    if (render(envelope.data)) {
      $("pipeline-status").textContent = "Workflow " + run + " is " + envelope.data.state + ".";
      $("pipeline").dataset.done = run; // tests wait on it
      return;
    }
    setTimeout(() => follow(run), 300);
  }

  $("pipeline-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const button = $("pipeline-run");
    button.disabled = true;
    $("pipeline-status").textContent = "Enqueueing…";
    try {
      const body = { members: typed($("pipeline-members"), 5), fail: $("pipeline-fail").checked };
      const envelope = await api("POST", "/api/demo/workflows", body);
      if (!envelope.ok) {
        $("pipeline-status").textContent = errors.show(envelope.error);
        return;
      }
      current = envelope.data.id;
      $("pipeline-status").textContent = "Workflow " + current + " enqueued; its members are starting.";
      follow(current);
    } finally {
      button.disabled = false;
    }
  });
})();
