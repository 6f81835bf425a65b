// /demo/jobs, the noisy-neighbour panel: a button floods the queue (tenant big, then small) in
// order, fair or rate-limited; the table then shows each tenant's waits as its jobs start,
// patched in place every 300 ms until every job has started.
"use strict";

(() => {
  const { api, el, patch } = mega;
  const $ = (id) => document.getElementById(id);
  const MODES = { in_order: "in order", fair: "fair", limited: "fair, rate-limited" };
  let current = null; // the run being drawn

  function ms(value) {
    return value === null ? "–" : value.toLocaleString("en") + " ms";
  }

  // One tenant's row; under its p99, a meter draws it against the slowest p99 of the run.
  function row(name, figures, longest) {
    const p99 = figures.wait_p99_ms;
    return el("tr", { "data-key": name },
      el("th", { scope: "row" }, name),
      el("td", { class: "num" }, figures.done + " of " + figures.enqueued),
      el("td", { class: "num" }, ms(figures.wait_p50_ms)),
      el("td", { class: "num" }, ms(p99),
        el("meter", { min: "0", max: String(Math.max(longest, 1)), value: String(p99 || 0),
          "aria-label": name + "'s p99 wait: " + ms(p99) })));
  }

  function render(data) {
    const tenants = Object.entries(data.tenants);
    const longest = Math.max(...tenants.map(([, t]) => t.wait_p99_ms || 0));
    patch($("noisy-rows"), tenants.map(([name, figures]) => row(name, figures, longest)));
    $("noisy-caption").textContent = "Run " + data.run + ", " + MODES[data.mode] +
      ": waiting time from enqueue to start, as the jobs run.";
    const starts = $("noisy-starts");
    starts.hidden = data.starts_per_s.length === 0;
    starts.textContent = "Starts in each second: " + data.starts_per_s.join(", ") + ".";
    $("noisy-table").hidden = false;
    $("noisy-empty").hidden = true;
    return tenants.every(([, t]) => t.done === t.enqueued);
  }

  async function follow(run) {
    if (run !== current) return; // a newer flood took over
    const envelope = await api("GET", "/api/demo/jobs/noisy/" + run);
    if (!envelope.ok) {
      $("noisy-status").textContent = envelope.error.message;
      return;
    }
    if (render(envelope.data)) {
      $("noisy-status").textContent = "Every job of run " + run + " has started.";
      $("noisy").dataset.done = run; // tests wait on it
      return;
    }
    setTimeout(() => follow(run), 300);
  }

  for (const button of document.querySelectorAll("[data-noisy-mode]")) {
    button.addEventListener("click", async () => {
      const mode = button.dataset.noisyMode;
      $("noisy-status").textContent = "Enqueueing the flood…";
      button.disabled = true;
      try {
        const body = { fair: mode !== "in_order", rate_limited: mode === "limited" };
        const envelope = await api("POST", "/api/demo/jobs/noisy", body);
        if (!envelope.ok) {
          $("noisy-status").textContent = envelope.error.message;
          return;
        }
        current = envelope.data.run;
        $("noisy-status").textContent = "Run " + current + " (" + MODES[mode] + ") enqueued; its jobs are starting.";
        follow(current);
      } finally {
        button.disabled = false;
      }
    });
  }
})();
