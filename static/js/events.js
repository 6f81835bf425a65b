// /demo/events: sign up without a reload, the outbox and the relay switch, each event with each
// listener group's status, and the groups' dead letters with requeue. The live lists are keyed
// and patched in place (mega.patch), built exactly as the page renders them, so a refresh that
// changes nothing touches nothing: a focused Requeue button keeps its focus.
"use strict";

(() => {
  const { api, poll, el, patch, replaceRows, fieldErrors } = mega;
  const $ = (id) => document.getElementById(id);
  const csrf = () => document.querySelector('meta[name="csrf-token"]').content;
  const clock = (iso) => (iso ? iso.slice(11, 19) : "");
  // A group's status as the page words it: an unpublished event is not queued anywhere yet.
  const statusText = (status) => (status === "waiting" ? "waiting for the relay" : status);

  function eventCard(event) {
    const published = event.status === "published";
    return el("article", { class: "job", "data-key": event.id, "data-id": event.id, "data-status": event.status },
      el("header", { class: "job-head" },
        el("span", { class: "mono small" }, event.name),
        el("span", { class: "badge " + (published ? "status-done" : "status-queued") }, event.status),
        el("span", { class: "muted small job-to" }, event.email),
        el("time", { class: "muted small mono", datetime: event.at }, clock(event.at))),
      el("ul", { class: "plain-list small" }, ...Object.entries(event.listeners).map(([group, status]) =>
        el("li", { "data-key": group, "data-group": group },
          el("span", { class: "badge status-" + status }, statusText(status)), " ", el("span", { class: "mono" }, group))),
        ownJob(event.job)));
  }

  // The signup's own job, written in its transaction with outbox.enqueue; its page in the admin.
  function ownJob(job) {
    return el("li", { "data-key": "job", "data-job": job.id },
      el("span", { class: "badge status-" + job.state }, statusText(job.state)), " ",
      el("a", { class: "mono", href: "/admin/jobs/" + job.id + "?job=" + job.name }, job.name), " ",
      el("span", { class: "muted" }, "its own job"));
  }

  function dlqItem(item) {
    const hidden = (name, value) => el("input", { type: "hidden", name, value });
    return el("li", { class: "dlq-item", "data-key": item.group + "|" + item.id },
      el("div", {},
        el("span", { class: "mono small" }, item.group), " ",
        el("span", { class: "muted small" }, item.email + ", " + item.attempts + " attempts, failed at ",
          el("time", { datetime: item.failed_at }, clock(item.failed_at))),
        el("div", { class: "small" }, item.error)),
      el("form", { method: "post", action: "/demo/events/dlq/requeue", class: "requeue-form" },
        hidden("csrf_token", csrf()), hidden("group", item.group), hidden("id", item.id),
        el("button", { class: "btn", type: "submit",
          "aria-label": "Requeue the event for " + item.email + " in " + item.group }, "Requeue")));
  }

  function groupRow(g) {
    return el("tr", { "data-key": g.group },
      el("td", { class: "mono small" }, g.group),
      el("td", { class: "num" }, g.done),
      el("td", { class: "num" }, g.failed),
      el("td", { class: "num" }, g.dlq));
  }

  function render(state) {
    const o = state.outbox;
    $("outbox-pending").textContent = o.pending;
    $("outbox-published").textContent = o.published;
    $("outbox-lag").textContent = Math.round(o.lag_ms) + " ms";
    $("relay-state").textContent = o.paused ? "relay paused" : "relay running";
    $("relay-state").className = "badge " + (o.paused ? "badge-warn" : "badge-ok");
    $("relay-paused").value = o.paused ? "false" : "true";
    $("relay-toggle").textContent = o.paused ? "Resume the relay" : "Pause the relay";
    patch($("events"), state.events.map(eventCard));
    $("events-empty").hidden = state.events.length > 0;
    replaceRows($("groups").tBodies[0], state.listeners.map(groupRow));
    $("credit-rows").textContent = state.credits.rows;
    patch($("dlq-items"), state.dlq.map(dlqItem));
    $("dlq-empty").hidden = state.dlq.length > 0;
  }

  async function load() {
    const envelope = await api("GET", "/api/demo/events");
    if (envelope.ok) render(envelope.data);
    else $("signup-result").textContent = envelope.error.message;
    return envelope.ok;
  }

  // One listener for every Requeue form, those rendered now and those a refresh adds later.
  $("dlq-items").addEventListener("submit", async (event) => {
    const form = event.target.closest(".requeue-form");
    if (!form) return;
    event.preventDefault();
    const button = form.querySelector("button");
    button.disabled = true;
    try {
      await api("POST", "/api/demo/events/dlq/requeue",
        { group: form.elements.group.value, id: form.elements.id.value });
      await load();
    } finally {
      button.disabled = false;
    }
  });

  const errors = fieldErrors($("signup-form"));

  $("signup-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    $("signup-result").textContent = "";
    const button = $("signup");
    button.disabled = true;
    try {
      const envelope = await api("POST", "/api/demo/events/signup",
        { email: $("signup-email").value, mode: $("signup-mode").value });
      if (envelope.ok) {
        $("signup-result").textContent = envelope.data.committed
          ? "Committed: signup " + envelope.data.signup_id + ", event in the outbox."
          : "Rolled back: no signup, no event.";
        await load();
      } else {
        $("signup-result").textContent = errors.show(envelope.error);
      }
    } finally {
      button.disabled = false;
    }
  });

  $("relay-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const button = $("relay-toggle");
    button.disabled = true;
    try {
      await api("POST", "/api/demo/events/relay", { paused: $("relay-paused").value === "true" });
      await load();
    } finally {
      button.disabled = false;
    }
  });

  poll(load, 1000);
})();
