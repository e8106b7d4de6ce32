"""The rules of the workflow runs (issue 40, tests/chaos/workflow.py): trials, checks, expiries with continuation.

* merged: a retry tree's merged view (`GET /v1/batches/{root}/results?merged=true`, read at the end) holds every
  custom_id its root owes exactly once, and nothing else;
* continued: a `batch_expired` line that says its request continues in the background names a child that is a
  batch of the tree (`retry_of` the expired batch) holding that custom_id, and the merged view's line for it is
  not the expired one but the child's (or a retry's below the child: the latest attempt wins); a batch with
  `on_expiry` that expired leaves no `batch_expired` line naming no child;
* trial: a reported trial marked as many lines as it asked for (`lines`, or `ceil(share x total)`), its report ran
  exactly those (`lines_run`), and in a run where no fault interrupted running work (no kill -9 of a GPU worker,
  no Postgres stop: the only ways a finished answer goes unrecorded) the engines finished no trial line with a
  recorded result more often than the result says it was drawn (`attempts.count`, 1 unchecked): no trial line
  ran twice. Its finishes are those of all its claims: a line's failed draws go with its row when it is handed
  back (a pause, a drain), and its next claim goes on with the next draw (docs/workflow.md "Checked answers";
  `workflow.draw_finishes`). Not judged: trial lines of a batch the tenant paused before the line's result was
  stored. A pause hands back a result finished but not yet stored, and the next claim makes that draw again: from
  its tokens (the ledger marks it, one token decoded again) or, for a redraw (its seed resumes nothing), from the
  prompt, which no ledger event tells from another draw;
* billed (a line is never billed for more attempts than it made): a result line's `attempts` are consistent
  (`count` = failed draws + 1 for an answer, = failed draws for `checks_failed`; at most the batch's
  `max_attempts`; `checks_failed` only once all `max_attempts` failed); the engines finished at least `count`
  answers for it over its claims (a continued line's, over its source's and its copy's: the copy goes on with the
  source's draws); and what its row was billed (completion tokens, failed draws included) is at
  most the sum of the `count` longest of those answers, and at least its kept answer's. A cut answer (expiry)
  finishes nothing: it is billed at most the tokens the engines generated for it (decoded plus resumed), its
  failed draws included.

The last two read the fake engines' decode ledger (`History.finishes`, `generated`); on the real engine (no ledger)
only the `attempts` consistency is checked.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from tests.chaos.history import BatchRecord, Finding, History, RowRecord, Verdict, error_code
from tests.chaos.workflow import continued_in


def check_workflow(verdict: Verdict, history: History) -> None:
    """The four rules of the module docstring (nothing to check in a run without trials, checks or windows)."""
    _check_merged(verdict, history)
    _check_continued(verdict, history)
    _check_trials(verdict, history)
    _check_billed(verdict, history)


def _lines(record: BatchRecord) -> list[dict[str, Any]]:
    return record.output_lines + record.error_lines


def _tree_ids(history: History, root: str) -> set[str]:
    ids, grew = {root}, True
    while grew:
        below = {r.batch_id for r in history.batches.values() if r.retry_of in ids}
        grew = not below <= ids
        ids |= below
    return ids


def _check_merged(verdict: Verdict, history: History) -> None:
    for root, lines in sorted(history.merged.items()):
        record = history.batches.get(root)
        source = history.inputs.get(record.input_file_id) if record else None
        if record is None or source is None or (record.cancel_requested and not record.request_counts.get("total")):
            continue
        owed = {line.custom_id for line in source.lines}
        seen = Counter(str(line.get("custom_id")) for line in lines)
        if missing := sorted(owed - set(seen)):
            verdict.findings.append(Finding("merged", root, f"merged view lacks {missing[:5]}", len(missing)))
        for cid, times in sorted(seen.items()):
            if times > 1:
                verdict.findings.append(Finding("merged", root, f"{cid} in {times} merged lines", times - 1))
            if cid not in owed:
                verdict.findings.append(Finding("merged", root, f"merged view holds {cid}, never submitted"))


def _check_continued(verdict: Verdict, history: History) -> None:
    roots = {r.batch_id for r in history.batches.values() if r.retry_of is None}
    merged = {
        str(line.get("custom_id")): (root, line) for root in roots for line in history.merged.get(root, []) for _ in [0]
    }
    for record in history.batches.values():
        for line in record.error_lines:
            cid, child = str(line.get("custom_id")), continued_in(line)
            if child is None:
                if record.on_expiry and error_code(line) == "batch_expired":
                    detail = f"{cid} expired without a child though the batch continues in the background"
                    verdict.findings.append(Finding("continued", record.batch_id, detail))
                continue
            found = history.batches.get(child)
            if found is None or found.retry_of != record.batch_id:
                detail = f"{cid} continues in {child}, which is not a retry of it we know"
                verdict.findings.append(Finding("continued", record.batch_id, detail))
                continue
            below = _tree_ids(history, child)
            answers = {
                str(other.get("id"))
                for batch_id in below
                for other in _lines(history.batches[batch_id])
                if str(other.get("custom_id")) == cid
            }
            if not answers:
                verdict.findings.append(Finding("continued", child, f"{cid} continued here but has no line"))
                continue
            root_line = merged.get(cid)
            if root_line is not None and str(root_line[1].get("id")) not in answers:
                detail = f"the merged view gives {cid} from {root_line[1].get('id')}, not from its child {child}"
                verdict.findings.append(Finding("continued", record.batch_id, detail))


def _result_lines(record: BatchRecord) -> dict[str, dict[str, Any]]:
    return {str(line.get("id")): line for line in _lines(record)}


def _count(line: dict[str, Any] | None) -> int:
    return int(((line or {}).get("attempts") or {}).get("count", 1))


def _check_trials(verdict: Verdict, history: History) -> None:
    clean = history.interrupting_faults() == 0 and bool(history.finishes)
    for record in history.batches.values():
        trial = record.trial or {}
        report = trial.get("report")
        if trial.get("status") != "reported" or not report:
            continue
        rows = [row for row in history.rows.get(record.batch_id, []) if row.trial]
        total = int(record.request_counts.get("total", 0))
        asked = trial["lines"] if "lines" in trial else math.ceil(float(trial["share"]) * total)
        want = max(1, min(int(asked), total))
        if not (len(rows) == want == int(report.get("lines_run", -1))):
            detail = f"trial of {want} lines marked {len(rows)}, reported {report.get('lines_run')}"
            verdict.findings.append(Finding("trial", record.batch_id, detail))
        if not clean:
            continue
        results = _result_lines(record)
        paused = [c.acked_at for c in history.controls if c.kind == "pause" and c.batch_id == record.batch_id]
        for row in rows:
            if row.run_id is None:  # no worker recorded a result: cancelled, expired, stopped while it ran
                continue
            if any(at is not None and at < (row.finished_at or 0) for at in paused):
                continue  # a pause may hand back a finished result unstored: that draw is made again (the docstring)
            ran = len(history.finishes.get(row.row_id, []))
            if ran > _count(results.get(row.row_id)):
                detail = f"trial line {row.custom_id} finished {ran} times for {_count(results.get(row.row_id))} draws"
                verdict.findings.append(Finding("trial", record.batch_id, detail))


def _check_billed(verdict: Verdict, history: History) -> None:
    continuations = {child for r in history.batches.values() for line in r.error_lines if (child := continued_in(line))}
    for record in history.batches.values():
        rows = {row.row_id: row for row in history.rows.get(record.batch_id, [])}
        most = int((record.checks or {}).get("max_attempts", 1))
        for rid, line in _result_lines(record).items():
            if problem := _attempts_problem(line, most=most):
                verdict.findings.append(Finding("billed", record.batch_id, f"{line.get('custom_id')}: {problem}"))
            row = rows.get(rid)
            if row is None or row.status != "completed" or not (history.finishes or history.generated):
                continue
            finished = history.finishes.get(row.row_id, [])
            if record.batch_id in continuations and row.copy_of:  # the copy went on with its source's draws
                finished = history.finishes.get(row.copy_of, []) + finished
            if problem := _billing_problem(line, row, history, finished):
                verdict.findings.append(Finding("billed", record.batch_id, f"{row.custom_id}: {problem}"))


def _attempts_problem(line: dict[str, Any], *, most: int) -> str | None:
    attempts = line.get("attempts")
    if attempts is None:
        return None
    count, failed = int(attempts.get("count", 0)), len(attempts.get("failed") or [])
    failed_line = error_code(line) == "checks_failed"
    if count < 1 or count > most:
        return f"{count} attempts, the batch allows {most}"
    if count != failed + (0 if failed_line else 1):
        return f"{count} attempts with {failed} failed draws"
    if failed_line and count != most:
        return f"checks_failed after {count} of {most} draws"
    return None


def _billing_problem(line: dict[str, Any], row: RowRecord, history: History, finishes: list[int]) -> str | None:
    body = (line.get("response") or {}).get("body") or {}
    kept = int((body.get("usage") or {}).get("completion_tokens", 0))
    if (body.get("backfill") or {}).get("cut_by"):
        made = history.generated.get(row.row_id, 0)
        return (
            f"a cut answer billed {row.completion_tokens} tokens of {made} generated"
            if row.completion_tokens > made
            else None
        )
    finished, count = sorted(finishes, reverse=True), _count(line)
    if len(finished) < count:
        return f"{count} attempts but the engines finished {len(finished)} answers"
    if not kept <= row.completion_tokens <= sum(finished[:count]):
        return (
            f"billed {row.completion_tokens} completion tokens: not between its answer's {kept} and its {count}"
            f" longest finished answers' {sum(finished[:count])}"
        )
    return None


WORKFLOW_COUNTS = ("trials", "trial_resumes", "redrawn", "checks_failed", "expired", "continued")


def workflow_counts(history: History) -> dict[str, int]:
    """How much of the workflow a run exercised: trials reported, trials the tenant resumed, lines drawn more than
    once, lines no draw satisfied, batches that expired, lines continued in a background child."""
    lines = [line for record in history.batches.values() for line in _lines(record)]
    return {
        "trials": sum(1 for r in history.batches.values() if (r.trial or {}).get("status") == "reported"),
        "trial_resumes": sum(1 for c in history.controls if c.kind == "trial_resume" and c.outcome == "ok"),
        "redrawn": sum(1 for line in lines if _count(line) > 1),
        "checks_failed": sum(1 for line in lines if error_code(line) == "checks_failed"),
        "expired": sum(1 for r in history.batches.values() if r.status == "expired"),
        "continued": sum(1 for line in lines if continued_in(line)),
    }
