"use strict";
// A batch's workflow (docs/workflow.md), as text: its trial and the trial's report, its checks and what expiry does,
// and each result line's attempts (the failed check of every draw) and the mark of an answer cut at expiry.
// Built with the page's own helpers (`h` makes elements from text, never markup; `usd` and `figure` format numbers).
window.BackfillWorkflow = function (h, usd, figure) {
  const share = (x) => Number((Number(x) * 100).toFixed(1)) + "%";  // 0.95 -> "95%"
  const lines = (n) => figure(n) + (n === 1 ? " line" : " lines");
  const CHECKS = { json_schema: "JSON schema", regex: "regex", enum: "one of", max_length: "at most" };

  // The checks as a person reads them: "line schema · regex lorem|ipsum · 3 attempts at most".
  function checksText(checks) {
    const parts = [];
    if (checks.schema) parts.push("the line's own schema");
    if (checks.json_schema !== undefined) parts.push(CHECKS.json_schema + " " + JSON.stringify(checks.json_schema).slice(0, 120));
    if (checks.regex !== undefined) parts.push(CHECKS.regex + " " + checks.regex);
    if (checks.enum !== undefined) parts.push(CHECKS.enum + " " + checks.enum.slice(0, 8).join(", ") + (checks.enum.length > 8 ? ", …" : ""));
    if (checks.max_length !== undefined) parts.push(CHECKS.max_length + " " + figure(checks.max_length) + " characters");
    parts.push(checks.max_attempts + (checks.max_attempts === 1 ? " draw" : " draws") + " at most");
    return parts.join(" · ");
  }
  function continues(trial) {
    return trial.continue === "auto" ? "continues automatically when at least " + share(trial.min_success_rate) + " succeed, else pauses"
      : "pauses after the trial: resume or cancel it here";
  }
  // The settings row under the batch's tiles: trial, checks, on_expiry.
  function settings(b) {
    const rows = [];
    if (b.trial) {
      const size = b.trial.lines !== undefined ? lines(b.trial.lines) : share(b.trial.share) + " of the lines";
      rows.push(["Trial", size + " first · " + continues(b.trial)]);
    }
    if (b.checks) rows.push(["Checks", checksText(b.checks)]);
    rows.push(["At expiry", b.on_expiry === "continue_in_background" ? "unfinished lines continue in the background tier"
      : "lines still generating end with what they generated (cut at expiry)"]);
    return h("table", { id: "batch-workflow-table", "aria-label": "Workflow settings" },
      h("tbody", {}, rows.map(([name, text]) => h("tr", { "data-setting": name.toLowerCase().replace(" ", "-") }, h("th", {}, name), h("td", {}, text)))));
  }

  const DECISIONS = {
    paused: "paused: resume to run the rest, or cancel", continued: "continued automatically",
    completed: "the trial was the whole batch", ended: "the batch was cancelled or expired during its trial",
  };
  function tile(label, value, id) { return h("div", { class: "tile", id: id || null }, h("small", {}, label), h("b", {}, value)); }
  // The trial card: what it runs while it runs, then its report.
  function trial(b) {
    const t = b.trial, r = t.report;
    const head = h("p", { id: "trial-status", "data-status": t.status },
      h("span", { class: "badge " + (t.status === "reported" ? "completed" : "in_progress") }, "trial " + t.status), " · " + continues(t) + ".");
    if (!r) return h("div", { id: "trial-report" }, head, h("p", { class: "note" },
      t.status === "pending" ? "The trial starts once the file is validated." : "Only the trial's lines run now; the rest waits for its report."));
    const cost = r.projected_cost || {};
    const c = r.checks;
    const tiles = [
      tile("Lines run", figure(r.lines_run) + " of " + figure(cost.lines ?? b.request_counts.total), "trial-lines"),
      tile("Success rate", share(r.success_rate) + " (" + figure(r.succeeded) + " succeeded)", "trial-rate"),
      c ? tile("Checks passed", figure(c.passed) + " of " + figure(r.lines_run) + " · " + figure(c.passed_first_time) + " at the first draw · "
        + figure(c.redrawn) + " redrawn · " + figure(c.failed) + " failed", "trial-checks") : null,
      tile("Tokens per line", "in " + r.tokens_per_line.input + " · out " + r.tokens_per_line.output, "trial-tokens"),
      tile("Projected cost", usd(cost.estimate_usd) + " (" + share(cost.confidence ?? 0.95) + ": " + usd(cost.low_usd) + " – " + usd(cost.high_usd) + ")", "trial-cost"),
      tile("Trial cost", usd(cost.trial_usd), "trial-spent"),
      tile("Decision", DECISIONS[r.decision] || r.decision, "trial-decision"),
    ].filter(Boolean);
    const codes = Object.entries(r.errors || {});
    const errors = codes.length ? h("table", { id: "trial-errors", "aria-label": "Trial lines failed by error code" },
      h("thead", {}, h("tr", {}, h("th", {}, "Error code"), h("th", { class: "num" }, "Lines"), h("th", { class: "num" }, "Share of the trial"))),
      h("tbody", {}, codes.map(([code, n]) => h("tr", { "data-code": code }, h("td", {}, h("code", {}, code)), h("td", { class: "num" }, figure(n)),
        h("td", { class: "num" }, share(r.lines_run ? n / r.lines_run : 0))))))
      : h("p", { class: "note", id: "trial-errors" }, "No trial line failed.");
    return h("div", { id: "trial-report" }, head, h("div", { class: "tiles" }, tiles), errors);
  }

  // A result line's answer object (`response.body`, or a Messages line's `result.message`) and its outcome.
  function answerBody(item) { return (item.response && item.response.body) || (item.result && item.result.message) || null; }
  function outcome(item) {
    if (item.error) return item.error.code || "error";
    if (item.result && item.result.type !== "succeeded") {
      const inner = item.result.error && item.result.error.error;
      return inner ? inner.type : item.result.type;
    }
    return "answered";
  }
  // One row per result line shown: its attempts, the failed check of each, and a cut at expiry.
  function attempts(items, checked) {
    const rows = items.filter((item) => item && (checked || item.attempts || cutOf(item)));
    if (!rows.length) return null;
    return h("table", { id: "results-attempts", "aria-label": "Attempts per line" },
      h("thead", {}, h("tr", {}, h("th", {}, "custom_id"), h("th", {}, "Outcome"), h("th", { class: "num" }, "Attempts"), h("th", {}, "Failed checks"))),
      h("tbody", {}, rows.map((item) => {
        const a = item.attempts || { count: 1, failed: [] }, cut = cutOf(item);
        return h("tr", { "data-custom-id": item.custom_id, "data-attempts": a.count },
          h("td", {}, h("code", {}, item.custom_id || "–")),
          h("td", {}, outcome(item), cut ? h("span", { class: "badge expired cut", title: "backfill.cut_by: " + cut }, " cut at " + cut) : null),
          h("td", { class: "num" }, figure(a.count)),
          h("td", {}, a.failed.length ? h("ol", { class: "failed-checks" }, a.failed.map((f) => h("li", { "data-check": f.check },
            "attempt " + f.attempt + ": ", h("b", {}, f.check), " · " + (f.message || "")))) : "none"));
      })));
  }
  function cutOf(item) { const body = answerBody(item); return body && body.backfill && body.backfill.cut_by ? String(body.backfill.cut_by) : null; }

  return { settings, trial, attempts };
};
