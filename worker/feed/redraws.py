"""Redraws (docs/workflow.md, "Checked answers"): the runner's record of its checked lines. An answer that fails
its batch's checks is drawn again at once in the same engine, under the same lease, with a new seed and the line
otherwise unchanged, up to `max_attempts`; the last answer is the line's result, with its attempts, or, when every
attempt failed, a `checks_failed` error carrying the last answer.

Failed attempts are billed when the operator says so (`checks_bill_failed_attempts`): their tokens are added to
the line's own; otherwise the line costs what its last answer cost. At each redraw the runner writes the failed
draws so far with the row (`drawn`, storage/queue/draws.py), so a line handed back before its result is stored (a
pause, a drain, a lost lease) goes on with its next draw on its next claim (`admitted` reads them back, `next_seed`
gives that draw's seed): a line makes at most `max_attempts` draws, whichever claims made them, and its result
lists and bills them all. A line cut short at expiry (`cut`) keeps the attempts it made too.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from typing import Any

from storage.queue.checkpoints import Generated
from storage.queue.claim import ClaimedRequest
from storage.queue.draws import Draws
from storage.settings import get_settings
from worker.engine import Engine, EngineRequest, EngineResult
from worker.feed.checks import OwnSchema, answers_of, evaluate, own_schema

CHECKS_FAILED = "checks_failed"
_SEED_STEP = 7919  # a redraw's seed: the line's own (else one from its id) plus this per extra attempt


@dataclass
class _Line:
    row: ClaimedRequest
    own: OwnSchema
    failed: list[dict[str, Any]] = field(default_factory=list)  # one per failed attempt: its check and why
    spent: list[int] = field(default_factory=lambda: [0, 0, 0])  # failed attempts' prompt, completion, cached


def next_seed(row: ClaimedRequest) -> int | None:
    """The seed of the draw a claimed row starts with: its body's own for a first draw, else the next redraw's."""
    if not row.checks or not row.draws.failed:
        return None
    return redraw_seed(row, len(row.draws.failed) + 1)


def redraw_seed(row: ClaimedRequest, attempt: int) -> int:
    """The seed of a line's `attempt`-th draw (2 and up): its body's seed, or one from its id, moved along."""
    base = row.body.get("seed")
    if not isinstance(base, int) or isinstance(base, bool):
        base = int(hashlib.sha256(row.id.encode()).hexdigest()[:8], 16)
    return (base + _SEED_STEP * (attempt - 1)) % 2**31


class Redraws:
    """The checked lines a runner holds: screens the engine's results, draws failing answers again."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._lines: dict[str, _Line] = {}
        self.redrawn = 0  # answers drawn again since start (tests, the probe)

    def admitted(self, row: ClaimedRequest) -> None:
        """A claimed row went into the engine: remember it if its batch has checks."""
        if row.checks:
            usage = row.draws.usage
            spent = [usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0), usage.get("cached_tokens", 0)]
            self._lines[row.id] = _Line(row, own_schema(row.url, row.body), list(row.draws.failed), spent)

    def drawn(self, request_ids: set[str] | list[str]) -> dict[str, Draws]:
        """The failed draws so far of these lines (those with checks), as their rows keep them."""
        return {
            rid: Draws(
                tuple(line.failed),
                {"prompt_tokens": line.spent[0], "completion_tokens": line.spent[1], "cached_tokens": line.spent[2]},
            )
            for rid in request_ids
            if (line := self._lines.get(rid)) is not None
        }

    def tag(self, generated: dict[str, Generated]) -> dict[str, Generated]:
        """These generations, each marked with the draw of its line it is (its failed draws so far)."""
        return {
            rid: replace(g, draw=len(line.failed)) if (line := self._lines.get(rid)) is not None else g
            for rid, g in generated.items()
        }

    def forget(self, request_ids: set[str] | list[str]) -> None:
        """Rows this runner no longer runs (lost, paused, handed back)."""
        for rid in request_ids:
            self._lines.pop(rid, None)

    def screen(self, results: list[EngineResult]) -> tuple[list[EngineResult], dict[str, str]]:
        """The results that are final (with their attempts), and {row: claim} of those drawn again instead."""
        final: list[EngineResult] = []
        redrawn: dict[str, str] = {}
        for result in results:
            line = self._lines.get(result.request_id)
            if line is None:
                final.append(result)
                continue
            checks = line.row.checks or {}
            failure = evaluate(checks, line.own, answers_of(line.row.url, result.body)) if result.ok else None
            if failure is None or len(line.failed) + 1 >= int(checks.get("max_attempts", 1)):
                final.append(self._close(line, result, failure))
                continue
            line.failed.append({"attempt": len(line.failed) + 1, "check": failure.check, "message": failure.message})
            line.spent = [line.spent[0] + result.prompt_tokens, line.spent[1] + result.completion_tokens,
                          line.spent[2] + result.cached_tokens]  # fmt: skip
            again = EngineRequest(
                request_id=result.request_id,
                url=line.row.url,
                body=line.row.body,
                adapter=line.row.adapter,  # under the adapter the line named, as its first draw
                adapter_path=line.row.adapter_path,
                seed=redraw_seed(line.row, len(line.failed) + 1),
            )
            if (refused := self.engine.add(again)) is not None:
                final.append(self._close(line, refused, None))
                continue
            self.redrawn += 1
            redrawn[result.request_id] = line.row.claim_id
        return final, redrawn

    def _close(self, line: _Line, result: EngineResult, failure: Any) -> EngineResult:
        """The line's result: its attempts on it, failed attempts billed or not, `checks_failed` if all failed."""
        self._lines.pop(result.request_id, None)
        failed = list(line.failed)
        if failure is not None:
            failed.append({"attempt": len(failed) + 1, "check": failure.check, "message": failure.message})
        result.attempts = {"count": len(line.failed) + 1, "failed": failed}
        _bill(line, result)
        if failure is not None:
            result.status_code, result.error_code = 422, CHECKS_FAILED
            result.error_message = (
                f"Every one of {len(failed)} answers failed a check; the last failed '{failure.check}': "
                f"{failure.message}. The line's response holds the last answer."
            )
        return result

    def cut(self, answers: list[EngineResult]) -> None:
        """Answers cut short at expiry (not checked: cut, not drawn): a line that made failed draws before keeps
        them, the cut answer its last attempt, billed as any result."""
        for answer in answers:
            line = self._lines.pop(answer.request_id, None)
            if line is not None and line.failed:
                answer.attempts = {"count": len(line.failed) + 1, "failed": list(line.failed)}
                _bill(line, answer)


def _bill(line: _Line, result: EngineResult) -> None:
    """Add the line's failed draws' tokens to its result's when the operator bills them."""
    # Read when the line closes: a runner outlives a settings change (its engine is loaded once).
    if get_settings().checks_bill_failed_attempts:
        result.prompt_tokens += line.spent[0]
        result.completion_tokens += line.spent[1]
        result.cached_tokens += line.spent[2]
