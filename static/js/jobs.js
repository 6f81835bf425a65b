// /demo/jobs: enqueue without a reload, a live card per job read from its status record (with a
// running job's progress, its result, Cancel), the DLQ with requeue. Refreshes patch the lists by job id, so focus and selection survive.
"use strict";

(() => {
  const { api, poll, el, patch, typed, fieldErrors } = mega;
  const $ = (id) => document.getElementById(id);
  const csrf = document.querySelector('meta[name="csrf-token"]').content;

  function percent(fraction) {
    return Math.round(fraction * 100) + "%";
  }

  // What run returned, as the template words it: "key: value, key: value".
  function resultText(result) {
    return Object.entries(result).map(([key, value]) => key + ": " + value).join(", ");
  }

  // Built exactly as templates/demo/jobs.html renders it, so the first refresh morphs nothing.
  function jobCard(job) {
    const progress = job.state === "running" && job.progress ? job.progress : null;
    return el("article", { class: "job", "data-key": job.id, "data-id": job.id, "data-status": job.state },
      el("header", { class: "job-head" },
        el("a", { class: "mono", href: "/admin/jobs/" + encodeURIComponent(job.id) + "?job=EmailJob",
                  title: "Its whole life on the admin pages" }, job.id),
        el("span", { class: "badge" }, job.mode),
        el("span", { class: "badge status-" + job.state }, job.state),
        el("span", { class: "muted small job-to" }, job.to),
        job.cancellable ? el("form", { method: "post", action: "/demo/jobs/" + job.id + "/cancel", class: "cancel-form" },
          el("input", { type: "hidden", name: "csrf_token", value: csrf }),
          el("button", { class: "btn btn-small", type: "submit", "aria-label": "Cancel job " + job.id }, "Cancel")) : null),
      progress && el("div", { class: "job-progress" },
        el("progress", { max: "1", value: String(progress.fraction), "aria-label": "Progress of job " + job.id },
          percent(progress.fraction)),
        el("span", { class: "small" }, percent(progress.fraction) + (progress.note ? ": " + progress.note : ""))),
      job.result !== null ? el("p", { class: "job-result small" }, "Result ", el("code", {}, resultText(job.result))) : null,
      el("ol", { class: "events" }, ...job.lines.map((line) =>
        el("li", { class: "event event-" + line.kind },
          ...(line.time ? [el("span", { class: "mono small muted" }, line.time), " "] : []), line.detail))));
  }

  function dlqItem(item) {
    return el("li", { class: "dlq-item", "data-key": item.id, "data-id": item.id },
      el("div", {},
        el("span", { class: "mono" }, item.id), " ",
        el("span", { class: "muted small" }, "to " + item.to + ", " + item.attempts + (item.attempts === 1 ? " attempt" : " attempts")),
        el("div", { class: "small" }, item.error)),
      el("form", { method: "post", action: "/demo/jobs/dlq/requeue", class: "requeue-form" },
        el("input", { type: "hidden", name: "csrf_token", value: csrf }),
        el("input", { type: "hidden", name: "id", value: item.id }),
        el("button", { class: "btn", type: "submit", "aria-label": "Requeue " + item.id }, "Requeue")));
  }

  // The page's own slice of the jobs: the newest ones, or those older than ?before=<id>.
  const before = new URLSearchParams(location.search).get("before");
  const pageJobs = $("jobs-page").dataset.pageJobs;
  const stateUrl = "/api/demo/jobs?limit=" + pageJobs + (before ? "&before=" + encodeURIComponent(before) : "");

  function render(state) {
    patch($("jobs"), state.jobs.map(jobCard));
    $("jobs-empty").hidden = state.jobs.length > 0;
    const older = $("jobs-older");
    older.hidden = !state.older;
    if (state.older) older.href = "/demo/jobs?before=" + encodeURIComponent(state.older) + "#timeline";
    $("dlq-count").textContent = state.dlq.count;
    patch($("dlq-items"), state.dlq.items.map(dlqItem));
    $("dlq-empty").hidden = state.dlq.items.length > 0;
    $("requeue-all").hidden = state.dlq.items.length === 0;
  }

  async function load() {
    const envelope = await api("GET", stateUrl);
    if (envelope.ok) {
      render(envelope.data);
      const root = $("jobs-page");
      root.dataset.loads = String(Number(root.dataset.loads) + 1); // refreshes so far (tests wait on it)
    } else {
      $("enqueue-result").textContent = envelope.error.message;
    }
    return envelope.ok;
  }

  async function requeue(body, button) {
    button.disabled = true;
    try {
      const envelope = await api("POST", "/api/demo/jobs/dlq/requeue", body);
      let said = envelope.ok ? "Requeued " + envelope.data.requeued + " job(s) from the DLQ." : envelope.error.message;
      if (envelope.ok && envelope.data.left_crashed) {
        said += " Left " + envelope.data.left_crashed + " that killed their worker (WorkerCrashed): each would kill one again; tick the box to requeue those too.";
      }
      $("enqueue-result").textContent = said;
      await load();
    } finally {
      button.disabled = false;
    }
  }

  const errors = fieldErrors($("enqueue-form"));

  function enqueued(data) {
    if (!data.ids) return "Enqueued " + data.id + ".";
    return "Enqueued " + data.ids.length + " jobs, " + data.ids[0] + " to " + data.ids[data.ids.length - 1] + ".";
  }

  $("enqueue-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    $("enqueue-result").textContent = "";
    const button = $("enqueue");
    button.disabled = true;
    try {
      const body = {
        to: $("job-to").value,
        mode: $("job-mode").value,
        delay_ms: typed($("job-delay"), 0),
        count: typed($("job-count"), 1),
      };
      const envelope = await api("POST", "/api/demo/jobs", body);
      if (envelope.ok) {
        $("enqueue-result").textContent = enqueued(envelope.data);
        await load();
      } else {
        $("enqueue-result").textContent = errors.show(envelope.error);
      }
    } finally {
      button.disabled = false;
    }
  });

  // The chosen mode's explanation under the select (its options stay short enough for a phone).
  $("job-mode").addEventListener("change", () => {
    const option = $("job-mode").selectedOptions[0];
    $("mode-help").textContent = option ? option.dataset.help || "" : "";
  });

  // One listener for every cancel form, present and future.
  $("jobs").addEventListener("submit", async (event) => {
    event.preventDefault();
    const form = event.target;
    const button = form.querySelector("button");
    const id = form.closest("article").dataset.id;
    button.disabled = true;
    try {
      const envelope = await api("POST", "/api/demo/jobs/" + encodeURIComponent(id) + "/cancel");
      $("jobs-notice").textContent = !envelope.ok ? envelope.error.message
        : envelope.data.cancelled ? "Job " + id + " cancelled: it will not run again."
          : "Job " + id + " was not cancelled: it had ended (" + envelope.data.state + ").";
      await load();
    } finally {
      button.disabled = false;
    }
  });

  // One listener for every requeue form, present and future (the list is patched in place).
  $("dlq-items").addEventListener("submit", (event) => {
    event.preventDefault();
    const form = event.target;
    requeue({ id: form.querySelector("input[name=id]").value }, form.querySelector("button"));
  });
  $("requeue-all").addEventListener("submit", (event) => {
    event.preventDefault();
    const crashed = $("requeue-crashed").checked;
    requeue({ all: true, crashed }, event.submitter || $("requeue-all").querySelector("button"));
  });

  poll(load, 1000);
})();
