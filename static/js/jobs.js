// /demo/jobs: enqueue without a reload, a live timeline per job, the DLQ with requeue.
"use strict";

(() => {
  const { api, poll, el } = mega;
  const $ = (id) => document.getElementById(id);

  function jobCard(job) {
    return el("article", { class: "job", "data-id": job.id, "data-status": job.status },
      el("header", { class: "job-head" },
        el("span", { class: "mono" }, job.id),
        el("span", { class: "badge" }, job.mode),
        el("span", { class: "badge status-" + job.status }, job.status),
        el("span", { class: "muted small job-to" }, job.to)),
      el("ol", { class: "events" }, ...job.events.map((e) =>
        el("li", { class: "event event-" + e.kind },
          el("span", { class: "mono small muted" }, e.time), " " + e.detail))));
  }

  function dlqItem(item) {
    const button = el("button", { class: "btn", type: "button" }, "Requeue");
    button.addEventListener("click", () => requeue({ id: item.id }, button));
    return el("li", { class: "dlq-item", "data-id": item.id },
      el("div", {},
        el("span", { class: "mono" }, item.id), " ",
        el("span", { class: "muted small" }, "to " + item.to + ", " + item.attempts + " attempts"),
        el("div", { class: "small" }, item.error)),
      button);
  }

  function render(state) {
    $("jobs").replaceChildren(...state.jobs.map(jobCard));
    $("jobs-empty").hidden = state.jobs.length > 0;
    $("dlq-count").textContent = state.dlq.count;
    $("dlq-items").replaceChildren(...state.dlq.items.map(dlqItem));
    $("dlq-empty").hidden = state.dlq.items.length > 0;
    $("requeue-all").hidden = state.dlq.items.length === 0;
  }

  async function load() {
    const envelope = await api("GET", "/api/demo/jobs");
    if (envelope.ok) render(envelope.data);
    else $("enqueue-result").textContent = envelope.error.message;
    return envelope.ok;
  }

  async function requeue(body, button) {
    button.disabled = true;
    try {
      await api("POST", "/api/demo/jobs/dlq/requeue", body);
      await load();
    } finally {
      button.disabled = false;
    }
  }

  $("enqueue-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    $("error-to").textContent = "";
    $("error-mode").textContent = "";
    $("error-delay_s").textContent = "";
    $("enqueue-result").textContent = "";
    const button = $("enqueue");
    button.disabled = true;
    try {
      const delay = Number.parseInt($("job-delay").value || "0", 10);
      const body = { to: $("job-to").value, mode: $("job-mode").value, delay_s: Number.isNaN(delay) ? $("job-delay").value : delay };
      const envelope = await api("POST", "/api/demo/jobs", body);
      if (envelope.ok) {
        $("enqueue-result").textContent = "Enqueued " + envelope.data.id + ".";
        await load();
      } else {
        const fields = envelope.error.fields || {};
        $("error-to").textContent = fields.to || "";
        $("error-mode").textContent = fields.mode || "";
        $("error-delay_s").textContent = fields.delay_s || "";
        $("enqueue-result").textContent = fields.to || fields.mode || fields.delay_s ? "" : envelope.error.message;
      }
    } finally {
      button.disabled = false;
    }
  });

  $("requeue-all").addEventListener("submit", (event) => {
    event.preventDefault();
    requeue({ all: true }, event.submitter || $("requeue-all").querySelector("button"));
  });
  for (const form of document.querySelectorAll("#dlq-items .requeue-form")) {
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      requeue({ id: form.querySelector("input[name=id]").value }, form.querySelector("button"));
    });
  }

  poll(load, 1000);
})();
