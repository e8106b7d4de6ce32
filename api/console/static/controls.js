"use strict";
// The batch controls, in one place: cancel, pause, resume, priority and retry (the batch-control routes,
// under the batch's own path, which the console's list gives: `b.path`). Each action asks for confirmation, calls its route
// and reports the server's answer as it is. `api(method, path, body)` resolves to {ok, status, body}.
window.BackfillControls = (function () {
  const base = (b) => b.path;
  const ENDED = ["completed", "failed", "expired", "cancelled"];
  const CONTROLLABLE = ["validating", "in_progress"];  // storage/lifecycle.py: CONTROLLABLE
  const ACTIONS = [
    { name: "pause", label: "Pause", when: (b) => CONTROLLABLE.includes(b.status) && !b.paused_at,
      confirm: (b) => "Pause " + b.id + "? No new lines start until you resume; running ones go back to the queue. The window keeps running.",
      done: () => "Pause: done, the batch is paused." },
    { name: "resume", label: "Resume", when: (b) => CONTROLLABLE.includes(b.status) && !!b.paused_at,
      confirm: (b) => "Resume " + b.id + "?", done: () => "Resume: done, the batch is running again." },
    { name: "priority", label: "Priority…", when: (b) => CONTROLLABLE.includes(b.status), ask: true,
      confirm: (b) => "New priority for " + b.id + " (an integer from -100 to 100; now " + b.priority + "):",
      done: (b, body) => "Priority: done, now " + body.priority + "." },
    // not while a retry of its tree runs (refused), nor once its retries completed every failed line (nothing left)
    { name: "retry", label: "Retry failed lines", when: (b) => ENDED.includes(b.status) && b.request_counts.failed > 0
        && !(b.retried && (b.retried.running_retry || b.retried.failing === 0)),
      confirm: (b) => "Retry the failed lines of " + b.id + " in a new batch? Lines that succeeded are not run or billed again.",
      done: () => "Retry: done, a new batch runs the failed lines: " },
    { name: "cancel", label: "Cancel", danger: true, when: (b) => !ENDED.includes(b.status) && b.status !== "cancelling",
      confirm: (b) => "Cancel " + b.id + "? Queued lines end at once; running ones within seconds.",
      done: () => "Cancel: done." },
  ];

  function askPriority(action, batch) {
    const value = window.prompt(action.confirm(batch), String(batch.priority ?? 0));
    if (value === null) return null;
    const priority = Number(value.trim());
    return Number.isInteger(priority) && priority >= -100 && priority <= 100 ? { priority } : undefined;
  }

  // Resolves to null (the person said no) or {text, batch}: the outcome, and a new batch's id to link to.
  async function run(action, batch, api) {
    let body;
    if (action.ask) {
      body = askPriority(action, batch);
      if (body === null) return null;
      if (body === undefined) return { text: "Priority: enter a whole number from -100 to 100." };
    } else if (!window.confirm(action.confirm(batch))) {
      return null;
    }
    const answer = await api("POST", base(batch) + "/" + action.name, body);
    if (answer.ok) return { text: action.done(batch, body || {}), batch: action.name === "retry" ? answer.body.id : null };
    const error = (answer.body && answer.body.error) || {};
    return { text: action.label.replace("…", "") + " refused (" + answer.status + "): " + (error.message || "HTTP " + answer.status) };
  }

  function render(container, batch, api, report) {
    container.replaceChildren();
    for (const action of ACTIONS) {
      if (!action.when(batch)) continue;
      const button = document.createElement("button");
      button.type = "button";
      button.textContent = action.label;
      button.dataset.action = action.name;
      button.className = action.danger ? "danger" : "plain";
      button.addEventListener("click", async () => {
        button.disabled = true;
        try {
          const outcome = await run(action, batch, api);
          if (outcome !== null) report(outcome);
        } finally {
          button.disabled = false;
        }
      });
      container.append(button);
    }
  }

  // Results while the batch runs: the first `limit` lines (GET /v1/batches/{id}/results?limit=, X-Incomplete while
  // running). Each poll names the answer it holds (If-None-Match): a batch that has not moved answers 304, no body.
  let held = null;  // {path, etag, view}: the last answer, one batch at a time
  async function results(batch, api, limit) {
    if (batch.protocol !== "openai") return null;
    const path = base(batch) + "/results?limit=" + limit, last = held && held.path === path ? held : null;
    const answer = await api("GET", path, undefined, "text", last ? { "If-None-Match": last.etag } : undefined);
    if (answer.status === 304 && last) return last.view;
    if (!answer.ok) return null;
    const view = { text: answer.body, incomplete: answer.headers.get("X-Incomplete") === "true" };
    const etag = answer.headers.get("ETag");
    held = etag ? { path, etag, view } : null;
    return view;
  }

  // sign-out: drop the last answer held (another key's lines must not outlive the session)
  function forget() { held = null; }

  return { render, results, forget };
})();
