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
    patch(tbody, rows);
    if (emptyNote) {
      emptyNote.hidden = rows.length > 0;
      tbody.closest("table").hidden = rows.length === 0; // no bare header over an empty state
    }
  }

  // Make `node` look like `fresh` while keeping `node` itself: attributes, text and children are
  // brought in line, and an element whose tag differs is replaced. What did not change is not
  // touched, so focus, selection, scroll and listeners survive a refresh.
  function morph(node, fresh) {
    if (node.nodeType !== fresh.nodeType || node.nodeName !== fresh.nodeName) {
      node.replaceWith(fresh);
      return fresh;
    }
    if (node.nodeType === Node.TEXT_NODE) {
      if (node.nodeValue !== fresh.nodeValue) node.nodeValue = fresh.nodeValue;
      return node;
    }
    for (const { name } of [...node.attributes]) {
      if (!fresh.hasAttribute(name)) node.removeAttribute(name);
    }
    for (const { name, value } of fresh.attributes) {
      if (node.getAttribute(name) !== value) node.setAttribute(name, value);
    }
    if (node.matches("[data-key]") || node.children.length || fresh.children.length) {
      patch(node, [...fresh.childNodes]);
    } else if (node.textContent !== fresh.textContent) {
      node.textContent = fresh.textContent;
    }
    return node;
  }

  // Bring `container`'s children in line with `nodes` (freshly built, in order). Children with a
  // `data-key` are matched by key, the others by position among the unkeyed ones; matched nodes
  // are morphed in place, new ones inserted, gone ones removed.
  function patch(container, nodes) {
    const keyed = new Map();
    const unkeyed = [];
    for (const child of [...container.childNodes]) {
      const key = child.nodeType === Node.ELEMENT_NODE ? child.getAttribute("data-key") : null;
      if (key !== null) keyed.set(key, child);
      else unkeyed.push(child);
    }
    const kept = [];
    for (const fresh of nodes) {
      const key = fresh.nodeType === Node.ELEMENT_NODE ? fresh.getAttribute("data-key") : null;
      const old = key !== null ? keyed.get(key) : unkeyed.shift();
      if (key !== null) keyed.delete(key);
      kept.push(old ? morph(old, fresh) : fresh);
    }
    for (const gone of [...keyed.values(), ...unkeyed]) gone.remove();
    kept.forEach((node, index) => {
      if (container.childNodes[index] !== node) container.insertBefore(node, container.childNodes[index] || null);
    });
  }

  return { api, poll, el, replaceRows, morph, patch };
})();
