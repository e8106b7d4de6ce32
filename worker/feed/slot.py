"""A worker's one engine slot, shared by several models: one loaded at a time, switched by `worker.feed.switching`.

Every `switch_check_seconds` (and at once when the loaded model runs dry) the slot reads each served
model's open work from the queue, sizes it like `storage.planning` does and turns it into engine seconds
at the model's measured rate, then applies the switching rule. A switch hands the loaded runner's
in-flight work back (it may finish for `switch_drain_seconds`, the rest is re-queued unrun, so nothing is
lost or run twice), closes the engine, drops every reference to it, and loads the next one, timing the load
so the next decision uses the measured reload cost. Every decision is logged; a repeated one at DEBUG.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sqlalchemy.orm import Session

from storage.clock import now_f
from storage.db import transaction
from storage.planning.shapes import JobShape, work_of
from storage.planning.throughput import throughput
from storage.queue.backlog import open_work_by_deadline
from storage.settings import Settings
from worker.engine import Engine
from worker.feed.runner import Runner
from worker.feed.switching import Backlog, DeadlineGroup, Decision, SwitchPolicy, decide

log = logging.getLogger(__name__)

FAILED_LOAD_BACKOFF_SECONDS = 300.0  # a model whose engine failed to load is left out this long


def read_backlogs(
    session: Session, *, models: Sequence[str], worker_id: str | None, settings: Settings, at: float
) -> list[Backlog]:
    """Each model's queued requests (plus those `worker_id` holds) by deadline, in engine seconds of work."""
    rows = open_work_by_deadline(session, models=models, worker_id=worker_id, at=at)
    rates = {model: _rate(session, model, settings) for model in {row[0] for row in rows}}
    groups: dict[tuple[str, int], list[float]] = {}
    for model, deadline, count, output_tokens, input_tokens in rows:
        shape = JobShape(int(count), int(input_tokens or 0), int(output_tokens or 0))
        work = work_of(shape, settings.prefill_weight)
        groups[(model, int(deadline))] = [int(count), work / rates[model]]
    return [
        Backlog(
            model,
            tuple(DeadlineGroup(float(d), int(n), s) for (m, d), (n, s) in groups.items() if m == model),
        )
        for model in models
    ]


def _rate(session: Session, model: str, settings: Settings) -> float:
    return throughput(session, model=model, settings=settings).work_per_second


@dataclass(frozen=True)
class Switch:
    """One completed switch: what was unloaded and loaded, how much went back to the queue, how long it took."""

    at: float
    unloaded: str | None
    loaded: str
    requeued: int
    unload_seconds: float
    load_seconds: float
    rule: str


class EngineSlot:
    """Serves `models` one at a time on one engine, switching when `worker.feed.switching` says so."""

    def __init__(
        self,
        models: Sequence[str],
        settings: Settings,
        *,
        load: Callable[[Settings, str], Engine],
        on_batch_done: Callable[[str], None] | None = None,
        worker_id: str | None = None,
    ) -> None:
        self.models = list(models)
        self.worker_id = worker_id  # every runner it loads owns its leases under this worker's id
        self.settings = settings
        self.load = load
        self.on_batch_done = on_batch_done
        self.policy = SwitchPolicy(
            min_residency_seconds=settings.switch_min_residency_seconds,
            default_reload_seconds=settings.switch_reload_seconds,
        )
        self.runner: Runner | None = None
        self.loaded_at = 0.0
        self.reload_seconds: dict[str, float] = {}
        self.decisions: deque[Decision] = deque(maxlen=1000)
        self.switches: deque[Switch] = deque(maxlen=1000)
        self._failed: dict[str, float] = {}
        self._next_check = 0.0
        self._lock = threading.RLock()

    @property
    def model(self) -> str | None:
        """The loaded model, if any."""
        return self.runner.model if self.runner is not None else None

    def warm(self) -> None:
        """Load what the backlog calls for, or the first model when there is no work (start-up)."""
        with self._lock:
            self.check()
            if self.runner is None:
                self._switch_to(self.models[0], rule="warm")

    def serve_for(self, seconds: float, *, stop: threading.Event | None = None) -> bool:
        """Feed the loaded engine for up to `seconds`, deciding as we go; False once no served model has work."""
        with self._lock:
            until = time.monotonic() + seconds
            while time.monotonic() < until and not (stop and stop.is_set()):
                if time.monotonic() >= self._next_check and self.check().action == "idle":
                    return False
                if self.runner is None:  # the chosen model failed to load; try again at the next check
                    return True
                chunk = min(until, self._next_check) - time.monotonic()
                if chunk > 0 and not self.runner.run_for(chunk, stop=stop):
                    self._next_check = 0.0  # the loaded model ran dry: decide at once
            return True

    def hand_back(self, *, drain_seconds: float) -> int:
        """Hand the loaded model's in-flight work back (a worker stopping); the engine stays loaded."""
        with self._lock:
            return self.runner.hand_back(drain_seconds=drain_seconds) if self.runner is not None else 0

    def check(self) -> Decision:
        """Read the backlog (one short transaction), decide, log, and switch if the rule says so."""
        with self._lock:
            self._next_check = time.monotonic() + self.settings.switch_check_seconds
            candidates = [m for m in self.models if not self._backing_off(m)]
            worker_id = self.runner.worker_id if self.runner is not None else None
            at = now_f()
            with transaction() as session:
                backlogs = read_backlogs(session, models=candidates, worker_id=worker_id, settings=self.settings, at=at)
            reload = {m: self.reload_seconds.get(m, self.policy.default_reload_seconds) for m in self.models}
            decision = decide(
                loaded=self.model,
                resident_seconds=time.monotonic() - self.loaded_at,
                backlogs=backlogs,
                reload_seconds=reload,
                now=at,
                policy=self.policy,
            )
            self._log(decision)
            if decision.action == "switch" and decision.model is not None:
                self._switch_to(decision.model, rule=decision.rule)
            return decision

    def _backing_off(self, model: str) -> bool:
        failed = self._failed.get(model)
        return failed is not None and time.monotonic() - failed < FAILED_LOAD_BACKOFF_SECONDS

    def _log(self, decision: Decision) -> None:
        last = self.decisions[-1] if self.decisions else None
        same = last is not None and (last.action, last.model, last.rule) == (
            decision.action,
            decision.model,
            decision.rule,
        )
        level = logging.DEBUG if same else logging.INFO
        log.log(level, "model switching [%s]: %s", decision.rule, decision.reason)
        self.decisions.append(decision)

    def _switch_to(self, model: str, *, rule: str) -> None:
        old, requeued, unload_seconds = self.runner, 0, 0.0
        unloaded = old.model if old is not None else None
        if old is not None:
            started = time.perf_counter()
            requeued = old.hand_back(drain_seconds=float(self.settings.switch_drain_seconds))
            self.runner = None
            old.close_io()
            old.engine.close()
            del old
            gc.collect()
            unload_seconds = time.perf_counter() - started
        started = time.perf_counter()
        try:
            engine = self.load(self.settings, model)
        except Exception:
            self._failed[model] = time.monotonic()
            log.exception(
                "model switching: loading %s failed; leaving it out for %.0f s", model, FAILED_LOAD_BACKOFF_SECONDS
            )
            return
        load_seconds = time.perf_counter() - started
        self.reload_seconds[model] = load_seconds
        self.runner = Runner(
            engine, model=model, settings=self.settings, on_batch_done=self.on_batch_done, worker_id=self.worker_id
        )
        self.loaded_at = time.monotonic()
        self.switches.append(Switch(now_f(), unloaded, model, requeued, unload_seconds, load_seconds, rule))
        if unloaded is None:
            log.info("model switch: (none) -> %s [%s]: loaded in %.1f s", model, rule, load_seconds)
            return
        log.info(
            "model switch: %s -> %s [%s]: %d in-flight re-queued, drained and unloaded in %.1f s, loaded in %.1f s",
            unloaded,
            model,
            rule,
            requeued,
            unload_seconds,
            load_seconds,
        )
