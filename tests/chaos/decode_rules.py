"""The history checker's decode rule (issue 21): checkpoints keep hand-backs from throwing decode work away.

A run's decode figures (`History.decode`) are the fake engines' decode ledger (worker/engine/decode_ledger.py,
one file per GPU-worker process, kept through kill -9) held against the output lines' `usage`: per delivered
request, discarded = tokens the engines decoded - completion tokens delivered; the share is discarded ÷
decoded over delivered requests (requests that ended without an output line are counted apart, not judged).
What a run is held to depends on its faults (`run_class`):

* graceful: no GPU worker killed -9, neither Postgres nor Redis down: its hand-backs are SIGTERM drains
  (`sigterm_gpu`) and the workload's pauses; it may discard at most GRACEFUL_SHARE of its decode tokens, plus
  one token per result a pause handed back unstored (`rerun_results`: its tokens go back as the row's
  checkpoint but the last, which an engine must decode again to end the generation);
* kill: a GPU worker killed -9 (`kill_gpu`, `kill_one_gpu`) and no Postgres or Redis fault: a request may
  lose at most the checkpoint bound (`History.checkpoint_bound_tokens`) per kill, the run at most kills x
  2 x max_num_seqs x the bound (what a runner holds: requests decoding and results not yet stored);
* other: a Postgres stop or a Redis kill (a result whose commit failed is decoded again): reported only.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from tests.chaos.history import BatchRecord, Finding, History, Verdict
from worker.engine.decode_ledger import RequestDecode, decode_figures, read_ledger

GRACEFUL_SHARE = 0.01
GPU_KILLS = frozenset({"kill_gpu", "kill_one_gpu"})
UNJUDGED = frozenset({"pg_stop", "pg_stop_renewal", "redis_kill"})
CLASSES = ("graceful", "kill", "other")


def run_class(history: History) -> str:
    """graceful, kill or other (see the module's docstring)."""
    kinds = {fault.kind for fault in history.faults}
    if kinds & UNJUDGED:
        return "other"
    return "kill" if kinds & GPU_KILLS else "graceful"


def delivered_tokens(batches: dict[str, BatchRecord]) -> dict[str, int]:
    """Request id -> completion tokens of its output line, over every batch's output file."""
    delivered: dict[str, int] = {}
    for record in batches.values():
        for line in record.output_lines:
            usage = ((line.get("response") or {}).get("body") or {}).get("usage") or {}
            delivered[str(line.get("id"))] = int(usage.get("completion_tokens", 0))
    return delivered


def record_decode(history: History, ledger_dir: Path) -> None:
    """Read the run's decode ledger into `history.decode` (left None when no engine kept one: the real engine)."""
    if not any(ledger_dir.glob("decode-*.log")):
        return
    ledger = continued_work(history, read_ledger(ledger_dir))
    delivered = delivered_tokens(history.batches)
    for record in history.batches.values():  # issue 40: a checked line's finished draws were judged, not thrown away
        for line in record.output_lines if record.checks else []:
            rid, work = str(line.get("id")), ledger.get(str(line.get("id")))
            body = (line.get("response") or {}).get("body") or {}
            cut = delivered[rid] if (body.get("backfill") or {}).get("cut_by") else 0  # a cut draw finishes nothing
            redrawn = int((line.get("attempts") or {}).get("count", 1)) > 1
            if work is not None and work.finished and (redrawn or cut):
                delivered[rid] = max(delivered[rid], sum(work.finished) + cut - work.resumed)
    figures = decode_figures(ledger, delivered)
    history.decode = asdict(figures)


def continued_work(history: History, ledger: dict[str, RequestDecode]) -> dict[str, RequestDecode]:
    """The ledger with each line continued in a background child (issue 40) counted as one request: the origin
    row's decode moves onto the child's copy, which resumed from its checkpoint and what the origin's worker handed
    it after the continuation (storage/queue/copy_tokens.py); what it did not get is decoded again: discarded)."""
    from tests.chaos.workflow import continued_in

    children = {child for r in history.batches.values() for line in r.error_lines if (child := continued_in(line))}
    merged = dict(ledger)
    for child in children:
        for row in history.rows.get(child, []):
            source = merged.pop(row.copy_of, None) if row.copy_of else None
            if source is None:
                continue
            mine = merged.get(row.row_id, RequestDecode())
            merged[row.row_id] = RequestDecode(
                decoded=source.decoded + mine.decoded,
                resumed=mine.resumed,
                attempts=source.attempts + mine.attempts,
                finished=source.finished + mine.finished,
            )
    return merged


def decode_summary(history: History) -> dict[str, Any]:
    """The run's class and decode figures, for its report and the totals over seeds (empty: no ledger)."""
    if history.decode is None:
        return {}
    keys = ("decoded", "delivered", "resumed", "discarded", "undelivered_decoded", "rerun_results")
    return {"class": run_class(history), **{key: history.decode[key] for key in keys}}


def class_shares(summaries: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per class, over runs: runs, decoded, discarded, resumed tokens and the discard share."""
    out: dict[str, dict[str, Any]] = {}
    for name in CLASSES:
        runs = [s for s in summaries if s.get("class") == name]
        decoded, discarded = sum(s["decoded"] for s in runs), sum(s["discarded"] for s in runs)
        out[name] = {
            "runs": len(runs),
            "decoded": decoded,
            "discarded": discarded,
            "resumed": sum(s["resumed"] for s in runs),
            "share": round(discarded / decoded, 5) if decoded else None,
        }
    return out


def check_discards(verdict: Verdict, history: History) -> None:
    """Graceful runs discard at most GRACEFUL_SHARE; kill runs at most the checkpoint bound per killed request."""
    figures = history.decode
    if figures is None:
        return
    if figures["unaccounted"]:
        detail = f"{figures['unaccounted']} delivered tokens that no engine's decode ledger shows decoded"
        verdict.findings.append(Finding("other", None, detail))
    decoded, discarded = figures["decoded"], figures["discarded"]
    kind = run_class(history)
    reruns = figures.get("rerun_results", 0)
    if kind == "graceful" and discarded > GRACEFUL_SHARE * decoded + reruns:
        detail = f"{discarded} of {decoded} decode tokens discarded ({discarded / decoded:.3f}) in a graceful run"
        detail += f" ({reruns} results a pause handed back)"
        verdict.findings.append(Finding("discarded", None, detail))
    if kind != "kill":
        return
    kills = sum(1 for fault in history.faults if fault.kind in GPU_KILLS)
    bound = kills * history.checkpoint_bound_tokens
    over = {rid: tokens for rid, tokens in figures["discarded_by_request"].items() if tokens > bound}
    if over:
        worst = max(over, key=over.__getitem__)
        detail = f"{len(over)} requests lost more than {bound} tokens to {kills} kills, {worst} {over[worst]}"
        verdict.findings.append(Finding("discarded", None, detail))
    if discarded > 2 * history.max_num_seqs * bound:
        detail = f"{discarded} tokens discarded, over {kills} kills x 2 x {history.max_num_seqs} slots x {bound}"
        verdict.findings.append(Finding("discarded", None, detail))
