"use strict";
// The batch controls, in one place so the routes of the batch-control issue (#20) are wired here alone.
// Each action asks for confirmation, calls its route and reports the server's answer as it is (a 404 until
// a route exists on this server). `api(method, path, body)` resolves to {ok, status, body}.
window.BackfillControls = (function () {
  const openai = (id) => "/v1/batches/" + encodeURIComponent(id);
  const anthropic = (id) => "/v1/messages/batches/" + encodeURIComponent(id);
  const ENDED = ["completed", "failed", "expired", "cancelled"];
  const ACTIONS = [
    { name: "cancel", label: "Cancel", danger: true, when: (b) => !ENDED.includes(b.status) && b.status !== "cancelling",
      path: (b) => (b.protocol === "anthropic" ? anthropic(b.id) : openai(b.id)) + "/cancel",
      confirm: (b) => "Cancel " + b.id + "? Queued lines end at once; running ones within seconds." },
    { name: "pause", label: "Pause", when: (b) => ["validating", "in_progress"].includes(b.status),
      path: (b) => openai(b.id) + "/pause", confirm: (b) => "Pause " + b.id + "? No new lines start until you resume." },
    { name: "resume", label: "Resume", when: (b) => b.status === "paused",
      path: (b) => openai(b.id) + "/resume", confirm: (b) => "Resume " + b.id + "?" },
    { name: "retry", label: "Retry failed lines", when: (b) => ENDED.includes(b.status) && b.request_counts.failed > 0,
      path: (b) => openai(b.id) + "/retry", confirm: (b) => "Retry the " + b.request_counts.failed + " failed lines of " + b.id + "?" },
    { name: "priority", label: "Priority…", when: (b) => !ENDED.includes(b.status),
      path: (b) => openai(b.id) + "/priority", ask: true, confirm: (b) => "New priority for " + b.id + " (an integer):" },
  ];

  function describe(action, answer) {
    if (answer.ok) return action.label.replace("…", "") + ": done (" + (answer.body.status || "ok") + ").";
    const error = (answer.body && answer.body.error) || {};
    const why = error.message || ("HTTP " + answer.status);
    return action.label.replace("…", "") + " refused (" + answer.status + "): " + why;
  }

  async function run(action, batch, api) {
    let body;
    if (action.ask) {
      const value = window.prompt(action.confirm(batch), "0");
      if (value === null) return null;
      body = { priority: Number.parseInt(value, 10) };
    } else if (!window.confirm(action.confirm(batch))) {
      return null;
    }
    return describe(action, await api("POST", action.path(batch), body));
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

  // Results while the batch runs (#20: GET /v1/batches/{id}/results?limit=, X-Incomplete while running).
  async function results(batch, api, limit) {
    if (batch.protocol !== "openai") return null;
    const answer = await api("GET", openai(batch.id) + "/results?limit=" + limit, undefined, "text");
    return answer.ok ? { text: answer.body, incomplete: answer.headers.get("X-Incomplete") === "true" } : null;
  }

  return { render, results };
})();
