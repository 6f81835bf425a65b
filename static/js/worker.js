// /demo/worker: the heartbeat (a bar per ping that grows while it is pending), the hash in the
// pool or inline with its progress bar, live pool state, and the kill / burst controls.
"use strict";

(() => {
  const { api, poll, el, typed, fieldErrors } = mega;
  const $ = (id) => document.getElementById(id);
  const STRIP_BEATS = 48; // bars kept in the strip
  const STALL_MS = 1000; // a beat slower than this waited for a blocked loop
  const SLOW_MS = 150;
  const SCALE_TOP_MS = 20000; // the top of the log scale
  const SCALE_TICKS = [[10, "10 ms"], [100, "100 ms"], [1000, "1 s"], [10000, "10 s"]];
  const PROGRESS_POLL_MS = 200;

  // ---- the heartbeat: one ping a second, each a bar of its round trip, growing while pending ----
  const beats = []; // {bar, sentAt, ms (null while pending), run (the run it was sent in, or 0)}
  let runSeq = 0; // the number of the run going on now, or of the last one
  let running = 0; // hash requests in flight
  let runMode = "";

  const heightOf = (ms) => Math.max(3, Math.min(100, (Math.log10(ms + 1) / Math.log10(SCALE_TOP_MS + 1)) * 100));
  const fmtMs = (ms) => Math.round(ms).toLocaleString("en-US") + " ms";

  function drawScale() {
    const scale = $("heartbeat-scale");
    scale.replaceChildren(...SCALE_TICKS.map(([ms, label]) => {
      const tick = el("div", { class: "tick" }, el("span", {}, label));
      tick.style.bottom = heightOf(ms) + "%";
      return tick;
    }));
  }

  function styleBar(beat, now) {
    const ms = beat.ms === null ? now - beat.sentAt : beat.ms;
    const kind = ms >= STALL_MS ? " stalled" : ms >= SLOW_MS ? " slow" : "";
    beat.bar.className = "beat" + kind + (beat.ms === null ? " pending" : "") + (beat.run ? " during" : "");
    beat.bar.style.height = heightOf(ms) + "%";
    beat.bar.title = (beat.ms === null ? "pending for " : "") + fmtMs(ms);
  }

  // The slowest beat sent during the current (or last) run, pending ones counted as they grow.
  function runMax(now) {
    let max = null;
    for (const beat of beats) {
      if (beat.run !== runSeq || runSeq === 0) continue;
      const ms = beat.ms === null ? now - beat.sentAt : beat.ms;
      if (max === null || ms > max) max = ms;
    }
    return max;
  }

  function describe(now) {
    const done = beats.filter((b) => b.ms !== null);
    const last = done.length ? done[done.length - 1].ms : null;
    const pending = beats.filter((b) => b.ms === null);
    const oldestPending = pending.length ? now - pending[0].sentAt : null;
    const max = runMax(now);
    $("beat-max").textContent = max === null ? "-" : fmtMs(max);
    $("beat-max-mode").textContent = max === null ? "" : "(" + runMode + (running ? ", running" : "") + ")";
    let label = "Heartbeat round trips, log scale: ";
    label += last === null ? "no beat answered yet" : "last beat " + fmtMs(last);
    if (oldestPending !== null && oldestPending >= SLOW_MS) label += "; a beat pending for " + fmtMs(oldestPending);
    if (max !== null) label += "; slowest during the last run " + fmtMs(max);
    $("heartbeat").setAttribute("aria-label", label);
    $("beat-last").textContent = oldestPending !== null && oldestPending >= STALL_MS
      ? "waiting " + fmtMs(oldestPending)
      : last === null ? "waiting" : "last beat " + fmtMs(last);
  }

  async function beat() {
    const strip = $("heartbeat");
    const entry = { bar: el("div", { class: "beat pending" }), sentAt: performance.now(), ms: null, run: running ? runSeq : 0 };
    beats.push(entry);
    strip.append(entry.bar);
    while (beats.length > STRIP_BEATS) beats.shift().bar.remove();
    $("heartbeat-empty").hidden = true;
    styleBar(entry, entry.sentAt);
    try {
      const envelope = await api("GET", "/api/demo/ping");
      if (!envelope.ok) throw new Error(envelope.error.message);
      $("live-dot").classList.remove("stale");
    } catch (_) {
      $("live-dot").classList.add("stale");
    }
    entry.ms = performance.now() - entry.sentAt;
    styleBar(entry, performance.now());
    if (entry.run && entry.run === runSeq) {
      $("beats-during").textContent = String(beats.filter((b) => b.run === runSeq && b.ms !== null).length);
    }
    describe(performance.now());
  }

  // Pending bars grow ten times a second: a stalled loop is visible while it stalls.
  function growPending() {
    const now = performance.now();
    for (const b of beats) if (b.ms === null) styleBar(b, now);
    describe(now);
  }

  drawScale();
  setInterval(beat, 1000);
  setInterval(growPending, 100);
  beat();

  // ---- the hash, its progress and its result card ----
  function newRunId() {
    const bytes = crypto.getRandomValues(new Uint8Array(12));
    return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
  }

  function resetResult(mode, rounds) {
    $("result-card").hidden = false;
    $("result-error").hidden = true;
    $("result-error").textContent = "";
    $("result-mode").textContent = mode;
    $("result-mode").className = "badge " + (mode === "pool" ? "badge-ok" : "badge-warn");
    $("result-rounds").textContent = rounds.toLocaleString("en-US");
    $("result-ms").textContent = "running…";
    $("result-digest").textContent = "";
    $("beats-during").textContent = "0";
  }

  function showProgress(fraction, note) {
    const bar = $("hash-progress");
    bar.value = fraction;
    bar.textContent = Math.round(fraction * 100) + "%";
    if (note) $("progress-note").textContent = note;
  }

  // Every run, of either kind, starts from an empty bar: nothing of the run before it shows.
  function resetProgress(inline) {
    $("run-progress").hidden = false;
    $("run-progress").dataset.mode = inline ? "inline" : "pool";
    $("hash-progress").dataset.reported = "0";
    showProgress(0, inline
      ? "no reports inline: the event loop that would answer the poll is busy hashing"
      : "waiting for the first report");
  }

  async function watchProgress(runId, isDone) {
    const bar = $("hash-progress");
    while (!isDone()) {
      const envelope = await api("GET", "/api/demo/worker/progress?run_id=" + runId).catch(() => null);
      if (isDone()) return;
      if (envelope && envelope.ok && envelope.data) {
        showProgress(envelope.data.fraction, envelope.data.note);
        bar.dataset.reported = String(Math.max(Number(bar.dataset.reported || 0), envelope.data.fraction));
      }
      await new Promise((resolve) => setTimeout(resolve, PROGRESS_POLL_MS));
    }
  }

  const errors = fieldErrors($("hash-form"));

  async function runHash(inline) {
    const rounds = typed($("hash-rounds"), 0);
    const mode = inline ? "inline" : "pool";
    const body = { input: $("hash-input").value, rounds, inline };
    const timeout = typed($("hash-timeout"), null);
    if (timeout !== null && !inline) body.timeout_ms = timeout; // the timeout is for pool runs
    const buttons = [$("run-pool"), $("run-inline")];
    buttons.forEach((b) => (b.disabled = true));
    runSeq += 1;
    running += 1;
    runMode = mode;
    resetResult(mode, rounds);
    let finished = false;
    const started = performance.now();
    resetProgress(inline);
    if (!inline) {
      body.run_id = newRunId();
      watchProgress(body.run_id, () => finished);
    }
    try {
      const envelope = await api("POST", "/api/demo/worker/hash", body);
      finished = true;
      if (!envelope.ok) {
        if (envelope.error.fields && errors.show(envelope.error) === "") {
          $("result-card").hidden = true; // nothing ran: the messages sit at their fields
          $("run-progress").hidden = true;
          return;
        }
        $("result-error").textContent = envelope.status + " " + envelope.error.code + ": " + envelope.error.message;
        $("result-error").hidden = false;
        $("result-ms").textContent = "stopped after " + fmtMs(performance.now() - started);
        $("progress-note").textContent = "stopped: " + envelope.error.code;
        return;
      }
      const r = envelope.data;
      $("result-rounds").textContent = r.rounds.toLocaleString("en-US");
      $("result-ms").textContent = r.ms.toLocaleString("en-US") + " ms";
      $("result-digest").textContent = r.digest;
      const all = "all " + r.rounds.toLocaleString("en-US") + " rounds";
      showProgress(1, inline ? all + ", known only once the loop was free again" : all);
    } catch (_) {
      finished = true;
      $("result-error").textContent = "the request failed: is the server up?";
      $("result-error").hidden = false;
    } finally {
      loadPool(); // the rate just measured
      running -= 1;
      $("beats-during").dataset.final = String(beats.filter((b) => b.run === runSeq).length);
      buttons.forEach((b) => (b.disabled = false));
      describe(performance.now());
    }
  }

  $("hash-form").addEventListener("submit", (event) => {
    event.preventDefault();
    runHash(event.submitter && event.submitter.value === "inline");
  });

  // ---- pool state, the measured rate and the pool log ----
  function setText(node, text) {
    if (node.textContent !== text) node.textContent = text; // only what changed
  }

  function showLog(lines) {
    const list = $("pool-log");
    const key = lines.map((line) => line.at + " " + line.text).join("\n");
    $("pool-log-empty").hidden = lines.length > 0;
    if (list.dataset.key === key) return;
    list.dataset.key = key;
    list.replaceChildren(...lines.map((line) =>
      el("li", {}, el("time", { class: "mono" }, line.at), " " + line.text)));
  }

  async function loadPool() {
    const envelope = await api("GET", "/api/demo/worker");
    if (!envelope.ok) return false;
    for (const key of ["busy", "queued", "size", "restarts", "max_restarts"]) {
      setText($("pool-" + key.replace("_", "-")), String(envelope.data[key]));
    }
    setText($("hash-rate"), envelope.data.rate_text);
    showLog(envelope.data.log);
    return true;
  }
  poll(loadPool, 1000);

  // ---- kill one child ----
  $("kill-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const out = $("kill-result");
    const envelope = await api("POST", "/api/demo/worker/kill");
    if (!envelope.ok) {
      out.textContent = envelope.status + " " + envelope.error.code + ": " + envelope.error.message;
    } else if (envelope.data.killed_pid === null) {
      out.textContent = "No child process to kill right now.";
    } else {
      out.textContent = "Killed child " + envelope.data.killed_pid + " (SIGKILL). Watch processes come back and restarts go up.";
    }
    loadPool();
  });

  // ---- burst: the server sends more runs than the pool holds, then this page sends one ----
  async function probe() {
    const response = await fetch("/api/demo/worker/hash", {
      method: "POST",
      headers: {
        Accept: "application/json",
        "Content-Type": "application/json",
        "X-CSRF-Token": document.querySelector('meta[name="csrf-token"]').content,
      },
      body: JSON.stringify({ input: "probe", rounds: 1000 }),
    });
    const envelope = await response.json().catch(() => ({ ok: false, error: { code: "bad_response" } }));
    return { status: response.status, retryAfter: response.headers.get("Retry-After"), envelope };
  }

  $("burst-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const out = $("burst-result");
    const button = $("burst");
    button.disabled = true;
    out.textContent = "sending…";
    try {
      const envelope = await api("POST", "/api/demo/worker/burst");
      if (!envelope.ok) {
        out.textContent = envelope.status + " " + envelope.error.code + ": " + envelope.error.message;
        return;
      }
      const b = envelope.data;
      const mine = await probe();
      loadPool();
      let text = b.sent + " runs sent at once to a pool that holds " + b.capacity + ": " + b.accepted +
        " ran, " + b.refused + " refused with 429 worker.overloaded" +
        (b.retry_after_s ? " (Retry-After: " + b.retry_after_s + " s)" : "") + ". ";
      if (b.failed.length) text += b.failed.length + " failed otherwise: " + b.failed.join(", ") + ". ";
      text += mine.status === 429
        ? "This page's own run, sent just after: " + mine.status + " " + mine.envelope.error.code + ", Retry-After: " + mine.retryAfter + " s."
        : "This page's own run, sent just after, got " + mine.status + " (the pool had room again).";
      out.textContent = text;
      out.dataset.refused = String(b.refused);
      out.dataset.probe = String(mine.status);
    } finally {
      button.disabled = false;
    }
  });
})();
