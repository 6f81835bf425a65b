// Shared by every page: CSRF-aware JSON calls, a polling loop, safe DOM building, and field
// errors shown at their fields.
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

  // A number field's value for a JSON body: digits as a number, an empty box as `empty`, and
  // anything else as typed, for the server to answer with the field's range.
  function typed(input, empty) {
    const text = input.value.trim();
    return /^\d+$/.test(text) ? Number(text) : text === "" ? empty : text;
  }

  // Field errors, one way on every form: a 422's message for a field sits in the element right
  // after its input (`#error-<name>`, made if the page has none), and the input is aria-invalid
  // and described by it. Every submit clears the form's messages; editing a field clears its own.
  // The page's no-JS answer renders the same markup (templates/_field.html).
  function fieldErrors(form) {
    const named = (name) => [...form.elements].find((input) => input.name === name && input.type !== "hidden" && input.type !== "submit");

    function slot(input) {
      const id = "error-" + input.name;
      let node = document.getElementById(id);
      if (!node) {
        node = el("span", { class: "field-error", id });
        input.after(node);
      }
      const described = (input.getAttribute("aria-describedby") || "").split(/\s+/).filter(Boolean);
      if (!described.includes(id)) input.setAttribute("aria-describedby", [id, ...described].join(" "));
      return node;
    }

    function clearField(input) {
      const node = document.getElementById("error-" + input.name);
      if (node) node.textContent = "";
      input.removeAttribute("aria-invalid");
    }

    function clear() {
      for (const input of form.elements) if (input.name) clearField(input);
    }

    // Show a failed call's messages at their fields; returns what is left for the form's status
    // line: "" when every message sits at its field, else the error's own message.
    function show(error) {
      const fields = (error && error.fields) || {};
      const placed = [];
      const elsewhere = [];
      for (const [name, message] of Object.entries(fields)) {
        const input = named(name);
        if (!input) {
          elsewhere.push(message);
          continue;
        }
        slot(input).textContent = message;
        input.setAttribute("aria-invalid", "true");
        placed.push(input);
      }
      if (placed.length) placed[0].focus();
      if (placed.length && !elsewhere.length) return "";
      return [error ? error.message : "", ...elsewhere].filter(Boolean).join(": ");
    }

    form.addEventListener("submit", clear, { capture: true }); // before the page's own handler
    form.addEventListener("input", (event) => { if (event.target.name) clearField(event.target); });
    return { show, clear };
  }

  return { api, poll, el, replaceRows, morph, patch, typed, fieldErrors };
})();
