// /demo/events: sign up without a reload, the outbox and the relay switch, each event with each
// listener group's status, and the groups' dead letters with requeue.
"use strict";

(() => {
  const { api, poll, el, replaceRows } = mega;
  const $ = (id) => document.getElementById(id);

  function eventCard(event) {
    const published = event.status === "published";
    return el("article", { class: "job", "data-id": event.id, "data-status": event.status },
      el("header", { class: "job-head" },
        el("span", { class: "mono small" }, event.name),
        el("span", { class: "badge " + (published ? "status-done" : "status-queued") }, event.status),
        el("span", { class: "muted small job-to" }, event.email)),
      el("ul", { class: "plain-list small" }, ...Object.entries(event.listeners).map(([group, status]) =>
        el("li", { "data-group": group },
          el("span", { class: "badge status-" + status }, status), " ", el("span", { class: "mono" }, group)))));
  }

  function dlqItem(item) {
    const button = el("button", { class: "btn", type: "button" }, "Requeue");
    button.addEventListener("click", () => requeue({ group: item.group, id: item.id }, button));
    return el("li", { class: "dlq-item", "data-id": item.id },
      el("div", {},
        el("span", { class: "mono small" }, item.group), " ",
        el("span", { class: "muted small" }, item.email + ", " + item.attempts + " attempts"),
        el("div", { class: "small" }, item.error)),
      button);
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
    $("events").replaceChildren(...state.events.map(eventCard));
    $("events-empty").hidden = state.events.length > 0;
    replaceRows($("groups").tBodies[0], state.listeners.map((g) =>
      el("tr", {},
        el("td", { class: "mono small" }, g.group),
        el("td", { class: "num" }, g.done),
        el("td", { class: "num" }, g.failed),
        el("td", { class: "num" }, g.dlq))));
    $("dlq-items").replaceChildren(...state.dlq.map(dlqItem));
    $("dlq-empty").hidden = state.dlq.length > 0;
  }

  async function load() {
    const envelope = await api("GET", "/api/demo/events");
    if (envelope.ok) render(envelope.data);
    else $("signup-result").textContent = envelope.error.message;
    return envelope.ok;
  }

  async function requeue(body, button) {
    button.disabled = true;
    try {
      await api("POST", "/api/demo/events/dlq/requeue", body);
      await load();
    } finally {
      button.disabled = false;
    }
  }

  $("signup-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    $("error-email").textContent = "";
    $("error-mode").textContent = "";
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
        const fields = envelope.error.fields || {};
        $("error-email").textContent = fields.email || "";
        $("error-mode").textContent = fields.mode || "";
        $("signup-result").textContent = fields.email || fields.mode ? "" : envelope.error.message;
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

  for (const form of document.querySelectorAll("#dlq-items .requeue-form")) {
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      requeue({ group: form.querySelector("input[name=group]").value,
                id: form.querySelector("input[name=id]").value }, form.querySelector("button"));
    });
  }

  poll(load, 1000);
})();
