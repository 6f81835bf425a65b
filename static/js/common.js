// Shared by every page: CSRF-aware JSON calls, a polling loop, and safe DOM building.
"use strict";

const mega = (() => {
  const csrf = () => document.querySelector('meta[name="csrf-token"]').content;

  // fetch() a JSON route; resolves to the envelope, whatever the status.
  async function api(method, url, body) {
    const options = { method, headers: { Accept: "application/json" } };
    if (method !== "GET") {
      options.headers["X-CSRF-Token"] = csrf();
      options.headers["Content-Type"] = "application/json";
      options.body = JSON.stringify(body || {});
    }
    const response = await fetch(url, options);
    if (response.status === 401) {
      window.location.assign("/login?next=" + encodeURIComponent(location.pathname));
    }
    let envelope;
    try {
      envelope = await response.json();
    } catch (_) {
      envelope = { ok: false, error: { code: "bad_response", message: "HTTP " + response.status } };
    }
    envelope.status = response.status;
    return envelope;
  }

  // Call `load` now and every `ms`; the live dot turns amber while calls fail.
  function poll(load, ms) {
    const dot = document.getElementById("live-dot");
    async function tick() {
      try {
        const fresh = await load();
        if (dot) dot.classList.toggle("stale", fresh === false);
      } catch (_) {
        if (dot) dot.classList.add("stale");
      }
      setTimeout(tick, ms);
    }
    tick();
  }

  // el("td", {class: "mono"}, "text", child...): text is always set as text, never as HTML.
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value !== null && value !== undefined && value !== false) node.setAttribute(key, value);
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function replaceRows(tbody, rows, emptyNote) {
    tbody.replaceChildren(...rows);
    if (emptyNote) {
      emptyNote.hidden = rows.length > 0;
      tbody.closest("table").hidden = rows.length === 0; // no bare header over an empty state
    }
  }

  return { api, poll, el, replaceRows };
})();
