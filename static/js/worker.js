// /demo/worker: a 1 s heartbeat strip, the hash in the pool or inline, live pool state.
"use strict";

(() => {
  const { api, poll, el } = mega;
  const $ = (id) => document.getElementById(id);
  const STRIP_BEATS = 48; // bars kept in the strip
  const STALL_MS = 1000; // a beat slower than this waited for a blocked loop
  let running = 0; // hash requests in flight
  let beatsDuringRun = 0;

  // ---- heartbeat: one ping a second, each drawn as a bar of its round-trip time ----
  async function beat() {
    const sent = performance.now();
    const inRun = running > 0;
    try {
      const envelope = await api("GET", "/api/demo/ping");
      if (!envelope.ok) throw new Error(envelope.error.message);
      draw(performance.now() - sent, inRun || running > 0);
    } catch (_) {
      $("live-dot").classList.add("stale");
    }
  }

  function draw(ms, duringRun) {
    const strip = $("heartbeat");
    const height = Math.max(3, Math.min(100, (Math.log10(ms + 1) / Math.log10(20000)) * 100));
    const bar = el("div", {
      class: "beat" + (ms >= STALL_MS ? " stalled" : ms >= 150 ? " slow" : "") + (duringRun ? " during" : ""),
      title: Math.round(ms) + " ms",
    });
    bar.style.height = height + "%";
    strip.append(bar);
    while (strip.children.length > STRIP_BEATS) strip.firstElementChild.remove();
    $("heartbeat-empty").hidden = true;
    $("live-dot").classList.remove("stale");
    $("beat-last").textContent = "last beat " + Math.round(ms) + " ms";
    if (running > 0) {
      beatsDuringRun += 1;
      $("beats-during").textContent = String(beatsDuringRun);
    }
  }

  setInterval(beat, 1000);
  beat();

  // ---- the hash ----
  async function runHash(inline) {
    const error = $("hash-error");
    error.textContent = "";
    const rounds = Number($("hash-rounds").value);
    const body = { input: $("hash-input").value, rounds, inline };
    const buttons = [$("run-pool"), $("run-inline")];
    buttons.forEach((b) => (b.disabled = true));
    running += 1;
    beatsDuringRun = 0;
    $("beats-during").textContent = "0";
    try {
      const envelope = await api("POST", "/api/demo/worker/hash", body);
      if (!envelope.ok) {
        const fields = envelope.error.fields || {};
        error.textContent = Object.entries(fields).map(([k, v]) => k + ": " + v).join("; ") || envelope.error.message;
        return;
      }
      const r = envelope.data;
      $("result-card").hidden = false;
      $("result-mode").textContent = r.mode;
      $("result-mode").className = "badge " + (r.mode === "pool" ? "badge-ok" : "badge-warn");
      $("result-rounds").textContent = r.rounds.toLocaleString();
      $("result-ms").textContent = r.ms + " ms";
      $("result-digest").textContent = r.digest;
    } finally {
      running -= 1;
      $("beats-during").dataset.final = String(beatsDuringRun);
      buttons.forEach((b) => (b.disabled = false));
    }
  }

  $("hash-form").addEventListener("submit", (event) => {
    event.preventDefault();
    runHash(event.submitter && event.submitter.value === "inline");
  });

  // ---- pool state ----
  poll(async () => {
    const envelope = await api("GET", "/api/demo/worker");
    if (!envelope.ok) return false;
    for (const key of ["busy", "queued", "size", "restarts"]) $("pool-" + key).textContent = envelope.data[key];
    return true;
  }, 1000);
})();
