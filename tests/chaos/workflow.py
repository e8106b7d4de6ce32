"""The chaos runs with trials, checks and expiries (issue 40, docs/chaos.md "Workflow"): `--workflow`.

`RunOptions(workflow=True)` gives the seed's batches, from a stream of their own (`workflow/<seed>`, so the seed's
lines, faults and control calls stay what they were), with probability

* 0.5 a **trial** (`{"share": 0.1..0.3}`, `continue` auto or manual, `min_success_rate` 0 or 0.95): a trial that
  pauses its batch is resumed by the tenant 0.2..1.5 s after it sees the report (`trial_resume` in `controls`);
* 0.5 **checks**: `regex` (the first of the fake's words is one of three of its eight: 3/8 of draws pass) or
  `max_length` (40..120 characters: long answers fail every draw), `max_attempts` 2..3;
* 0.35 a **short window** (3 or 8 s: `SHORT_WINDOWS`, offered beside 24h and background at the same discount, so
  the chaos price book's $1 per output token holds), two in three with `on_expiry: "continue_in_background"`: the window closes
  at a moment the run's faults and pauses make random, and a continued batch's child (found in its `retries`) is
  followed like any batch.

The rules the history is then held to are tests/chaos/workflow_rules.py's.
"""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

from tests.chaos.workload import PlannedBatch

# The short windows: a small batch alone fits in 3 s, but not behind the others, a trial, pauses and faults
SHORT_WINDOWS = ("3s", "8s")
# The background tier must be deeper than 24h: by a millionth, so the price book's $1 per output token holds to 6 places
WINDOWS = {"24h": "0.5", **{window: "0.5" for window in SHORT_WINDOWS}, "background": "0.500001"}
REGEX = "(lorem|ipsum|dolor)( .*)?"  # the fake's answers are its 8 words in turn from a seeded start
CONTINUE = "continue_in_background"


def workflow_env() -> dict[str, str]:
    """What the deployment adds: the short window offered (the background tier holds continued lines)."""
    return {"BACKFILL_COMPLETION_WINDOWS": json.dumps(WINDOWS)}


def plan_workflow(plan: list[PlannedBatch], rng: random.Random) -> list[PlannedBatch]:
    """Each batch of `plan` with its trial, checks and window drawn from `rng` (the module docstring)."""
    planned = []
    for batch in plan:
        extra: dict[str, Any] = {}
        if rng.random() < 0.5:
            extra["trial"] = {
                "share": round(rng.uniform(0.1, 0.3), 2),
                "continue": rng.choice(("auto", "manual")),
                "min_success_rate": rng.choice((0.0, 0.95)),
            }
        if rng.random() < 0.5:
            check: dict[str, Any] = {"regex": REGEX} if rng.random() < 0.5 else {"max_length": rng.randint(40, 120)}
            extra["checks"] = {**check, "max_attempts": rng.randint(2, 3)}
        window = "24h"
        if rng.random() < 0.35:
            window = rng.choice(SHORT_WINDOWS)
            if rng.random() < 2 / 3:
                extra["on_expiry"] = CONTINUE
        planned.append(replace(batch, workflow=extra, window=window))
    return planned


def trial_paused(batch: dict[str, Any]) -> bool:
    """The batch's trial has reported and paused it (`decision: paused`): the tenant resumes it."""
    trial = batch.get("trial") or {}
    report = trial.get("report") or {}
    return trial.get("status") == "reported" and report.get("decision") == "paused" and bool(batch.get("paused_at"))


def continued_in(line: dict[str, Any]) -> str | None:
    """The child batch a `batch_expired` error line says its request continues in, or None."""
    message = str((line.get("error") or {}).get("message") or "")
    marker = "continues in the background in batch "
    if marker not in message:
        return None
    return message.split(marker, 1)[1].rstrip(".").split()[0].rstrip(".")


def record_generations(history: Any, ledger_dir: Path) -> None:
    """Per request id, the answers (draws) the fake engines finished for it and the tokens they generated for it,
    over all its runs (decoded plus resumed), from the run's decode ledger (none on the real engine)."""
    from worker.engine.decode_ledger import read_ledger

    if not any(ledger_dir.glob("decode-*.log")):
        return
    for rid, decode in read_ledger(ledger_dir).items():
        history.generated[rid] = decode.decoded + decode.resumed
    for path in sorted(ledger_dir.glob("decode-*.log")):
        for rid, finished in draw_finishes(path.read_text()).items():
            history.finishes.setdefault(rid, []).extend(finished)


def draw_finishes(text: str) -> dict[str, list[int]]:
    """One ledger file's finished answers per request id: every draw the engine finished for it, those of claims
    a hand-back ended included (a line's draws survive a pause, a drain or a lost lease: its next claim goes on with
    its next draw, docs/workflow.md "Checked answers"). Less one: a finish followed by a begin from checkpoint
    tokens (a finished answer a pause handed back before it was stored, continued by the next claim: decoding its
    last token again is not another draw). A torn last line (a kill mid-write) is skipped."""
    ids: dict[str, str] = {}
    finishes: dict[str, list[int]] = {}
    last_finished: dict[str, bool] = {}
    for line in text.splitlines():
        parts = line.split()
        try:
            if parts[0] == "b":
                ids[parts[1]] = rid = parts[2]
                if int(parts[3]) > 0 and last_finished.get(rid):  # continues the answer it finished last
                    finishes[rid].pop()
                last_finished[rid] = False
            elif parts[0] == "f" and parts[1] in ids:
                finishes.setdefault(ids[parts[1]], []).append(int(parts[2]))
                last_finished[ids[parts[1]]] = True
            elif parts[0] == "a":
                for seq in parts[1:]:
                    if seq in ids:
                        last_finished[ids[seq]] = False
        except (IndexError, ValueError):
            continue
    return {rid: finished for rid, finished in finishes.items() if finished}


def read_merged(clients: dict[str, Any], history: Any, *, give_up_at: float) -> None:
    """Each retry tree's merged view, read through its tenant's client once every batch has ended."""
    import httpx

    from tests.chaos.workload import GaveUp

    for record in list(history.batches.values()):
        tenant = clients.get(record.tenant)
        if record.retry_of is not None or tenant is None:
            continue

        def fetch(batch_id: str = record.batch_id, tenant: Any = tenant) -> str:
            path = f"/batches/{batch_id}/results"
            answer = tenant.client.get(path, options={"params": {"merged": "true"}}, cast_to=httpx.Response)
            return str(answer.text)

        try:
            text = tenant.call("batches.results", fetch, give_up_at=give_up_at)
        except GaveUp:
            continue
        history.merged[record.batch_id] = [json.loads(line) for line in text.splitlines() if line.strip()]
