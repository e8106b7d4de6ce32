"""Which faults a run injects and when (all drawn from the seed), and the injector that carries them out.

A fault fires on a trigger: a moment after the workload starts, a share of all submitted requests
finished, or a batch about to finish (so "S3 down during finalize" really meets a finalize). It lasts
`down_seconds`, then is repaired: the process restarted, Postgres or Redis started again, the S3 proxy
forwarding again. Every fault is logged with its start and repair times.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import sqlalchemy as sa

from storage import lifecycle
from storage.models import BatchRequest
from tests.chaos.deployment import Deployment
from tests.chaos.history import FaultRecord
from tests.chaos.renewal_catch import RenewalCatch
from tests.chaos.services import Cluster

# One scenario per kind, in this order (seed % len picks it); "none" and "two_gpus" are controls. "sigterm_gpu"
# is the graceful hand-back (issue 21): SIGTERM to a GPU worker, which hands its work back with checkpoints
# and exits, then is started again.
KINDS = (
    "none",
    "kill_gpu",
    "pg_stop",
    "redis_kill",
    "s3_down_finalize",
    "kill_api",
    "kill_io",
    "kill_beat",
    "s3_down_upload",
    "kill_one_gpu",
    "two_gpus",
    "sigterm_gpu",
)
# Kinds a run gets only when asked for (`--kinds`, `scenario_for(kind=...)`), so the rotation above keeps each seed's
# scenario: "pg_stop_renewal" is a Postgres stop timed to land inside a worker's lease renewal (issue 41,
# tests/chaos/renewal_catch.py), down long enough for the leases it was renewing to expire meanwhile.
ASKED_KINDS = ("pg_stop_renewal",)
POSTGRES_STOPS = frozenset({"pg_stop", "pg_stop_renewal"})
EXTRA_KINDS = ("kill_api", "kill_gpu", "kill_io", "kill_beat", "pg_stop", "redis_kill")
EXTRA_FAULT_PROBABILITY = 0.3
TERM_TIMEOUT_SECONDS = 20.0  # a SIGTERM'd worker that has not exited by then (grace 15 s) is killed -9


@dataclass(frozen=True)
class Trigger:
    on: Literal["seconds", "progress", "batch_remaining"]
    value: float

    def describe(self) -> str:
        if self.on == "seconds":
            return f"{self.value:.1f} s after start"
        if self.on == "progress":
            return f"at {self.value:.0%} of requests done"
        return f"when a batch has <= {self.value:.0f} requests left"


@dataclass(frozen=True)
class FaultSpec:
    kind: str
    trigger: Trigger
    down_seconds: float  # math.inf: never repaired
    mode: str = ""  # S3 faults: "refuse" or "reset"


@dataclass(frozen=True)
class Scenario:
    seed: int
    name: str
    gpu_workers: int
    faults: tuple[FaultSpec, ...]

    def describe(self) -> str:
        return ", ".join(f"{f.kind}({f.trigger.describe()}, {f.down_seconds:.1f} s)" for f in self.faults) or "-"


def scenario_for(seed: int, *, kind: str | None = None) -> Scenario:
    """The seed's scenario: its kind (rotating through KINDS unless given), moments and durations."""
    rng = random.Random(f"faults/{seed}")
    name = kind or KINDS[seed % len(KINDS)]
    faults = [] if name in ("none", "two_gpus") else [_fault(name, rng)]
    if faults and rng.random() < EXTRA_FAULT_PROBABILITY:
        faults.append(_fault(rng.choice(EXTRA_KINDS), rng))
    gpu_workers = 2 if name in ("kill_one_gpu", "two_gpus") else 1
    return Scenario(seed, name, gpu_workers, tuple(faults))


def _fault(kind: str, rng: random.Random) -> FaultSpec:
    if kind == "s3_down_upload":
        return FaultSpec(
            kind, Trigger("seconds", rng.uniform(0.0, 1.5)), rng.uniform(2, 6), rng.choice(("refuse", "reset"))
        )
    if kind == "s3_down_finalize":
        trigger = Trigger("batch_remaining", rng.randint(2, 10))
        return FaultSpec(kind, trigger, rng.uniform(2, 6), rng.choice(("refuse", "reset")))
    if kind == "kill_one_gpu":
        return FaultSpec(kind, Trigger("progress", rng.uniform(0.1, 0.6)), math.inf)
    if kind == "pg_stop_renewal":  # the chaos leases last 5 s, renewed every 2 s: all lapse while it is down
        return FaultSpec(kind, Trigger("progress", rng.uniform(0.1, 0.6)), rng.uniform(5, 8))
    down = rng.uniform(1, 6) if kind in ("pg_stop", "redis_kill") else rng.uniform(0.2, 3.0)
    return FaultSpec(kind, Trigger("progress", rng.uniform(0.1, 0.7)), down)


class Probe:
    """The harness's own read-only view of the run's queue (to time faults); None while Postgres is down."""

    def __init__(self, url: str, *, planned_requests: int) -> None:
        self.url = url
        self.engine = sa.create_engine(
            url.replace("postgresql://", "postgresql+psycopg://"),
            pool_pre_ping=True,
            connect_args={"connect_timeout": 1},
        )
        self.planned = max(1, planned_requests)

    def progress(self) -> float | None:
        """Share of the workload's requests that have reached a terminal status."""
        query = sa.select(sa.func.count()).where(BatchRequest.status.in_(lifecycle.REQ_TERMINAL))
        done = self._read(lambda conn: conn.execute(query).scalar_one())
        return None if done is None else done / self.planned

    def nearly_done_batch(self, remaining: int) -> str | None:
        """A batch with between 1 and `remaining` requests still open, if any."""
        query = (
            sa.select(BatchRequest.batch_id)
            .where(BatchRequest.status.in_(lifecycle.REQ_OPEN))
            .group_by(BatchRequest.batch_id)
            .having(sa.func.count() <= remaining)
            .limit(1)
        )
        return self._read(lambda conn: conn.execute(query).scalar())

    def _read(self, fn: Callable[[sa.Connection], object]) -> object | None:
        try:
            with self.engine.connect() as conn:
                return fn(conn)
        except sa.exc.OperationalError:
            return None

    def close(self) -> None:
        self.engine.dispose()


@dataclass
class _Active:
    spec: FaultSpec
    target: str
    started_at: float
    repair_at: float
    detail: str
    restarted: bool = False  # a killed process was started again and is on its way back into service


@dataclass
class Injector:
    """Fires the scenario's faults when their triggers hold and repairs them when their time is up.

    `tick` runs on the main thread (it restarts processes; see tests/chaos/procs.py).
    """

    scenario: Scenario
    deployment: Deployment
    cluster: Cluster
    probe: Probe
    started_at: float
    log: list[FaultRecord] = field(default_factory=list)
    _pending: list[FaultSpec] = field(default_factory=list)
    _active: list[_Active] = field(default_factory=list)
    _rng: random.Random = field(default_factory=random.Random)
    _catch: RenewalCatch | None = None  # a pg_stop_renewal whose trigger held, waiting for a renewal to stop in

    def __post_init__(self) -> None:
        self._pending = list(self.scenario.faults)
        self._rng = random.Random(f"targets/{self.scenario.seed}")

    def tick(self) -> None:
        now = time.time()
        for active in [a for a in self._active if a.repair_at <= now and not a.restarted]:
            self._repair(active)
        self._watch_restarts()
        for spec in list(self._pending):
            if spec.kind == "pg_stop_renewal" and self._catch is not None:  # triggered: waiting for a renewal
                caught = self._catch.poll()
                detail = None if caught is None else f"{self._catch.trigger}, {caught}"
            else:
                detail = self._triggered(spec, now)
                if detail is not None and spec.kind == "pg_stop_renewal":
                    self._catch = RenewalCatch(self.probe.url, trigger=detail)
                    caught = self._catch.poll()
                    detail = None if caught is None else f"{detail}, {caught}"
            if detail is not None:
                self._pending.remove(spec)
                self._fire(spec, detail)

    @property
    def done(self) -> bool:
        """Every fault fired, and every one that gets repaired was."""
        return not self._pending and all(math.isinf(a.spec.down_seconds) for a in self._active)

    def repair_all(self, *, timeout: float = 300) -> None:
        """Repair whatever is still broken (a run that ends early must still be read back)."""
        if self._catch is not None:  # a stop still waiting for a renewal: its lease locks go
            self._catch.close()
            self._catch = None
        for active in list(self._active):
            if not math.isinf(active.spec.down_seconds) and not active.restarted:
                self._repair(active)
        deadline = time.monotonic() + timeout
        while any(a.restarted for a in self._active) and time.monotonic() < deadline:
            self._watch_restarts()
            time.sleep(0.1)

    def _watch_restarts(self) -> None:
        for active in [a for a in self._active if a.restarted]:
            if self.deployment.children[active.target].ready():
                self._ended(active)

    def _triggered(self, spec: FaultSpec, now: float) -> str | None:
        trigger = spec.trigger
        if trigger.on == "seconds":
            return trigger.describe() if now - self.started_at >= trigger.value else None
        if trigger.on == "progress":
            progress = self.probe.progress()
            return f"at {progress:.0%} done" if progress is not None and progress >= trigger.value else None
        batch = self.probe.nearly_done_batch(int(trigger.value))
        return None if batch is None else f"{batch} had <= {trigger.value:.0f} open"

    def _fire(self, spec: FaultSpec, detail: str) -> None:
        target = self._target(spec.kind)
        started = time.time()
        if spec.kind.startswith("kill_"):
            self.deployment.kill(target)
        elif spec.kind == "sigterm_gpu":  # blocks until it exits: its hand-back is part of the fault
            code = self.deployment.terminate(target, timeout=TERM_TIMEOUT_SECONDS)
            detail += f", exited {code}" if code is not None else ", did not exit in time: killed -9"
        elif spec.kind in POSTGRES_STOPS:
            self.cluster.postgres.stop_immediate()  # a pg_stop_renewal's: with the caught renewal still waiting
            if self._catch is not None:
                self._catch.close()
                self._catch = None
        elif spec.kind == "redis_kill":
            self.cluster.redis.kill()
        elif spec.kind.startswith("s3_down"):
            self.cluster.s3.proxy.down(spec.mode)  # type: ignore[arg-type]
            detail += f", {spec.mode}"
        else:
            raise ValueError(f"unknown fault kind {spec.kind}")
        active = _Active(spec, target, started, started + spec.down_seconds, detail)
        self._active.append(active)
        if math.isinf(spec.down_seconds):
            self.log.append(FaultRecord(spec.kind, target, started, None, detail))

    def _repair(self, active: _Active) -> None:
        kind = active.spec.kind
        # Two overlapping faults on one target are repaired once (the second repair finds it running).
        if kind.startswith("kill_") or kind == "sigterm_gpu":
            if not self.deployment.children[active.target].alive():
                self.deployment.restart(active.target)
            active.restarted = True  # repaired once it is back in service (`tick` watches its log)
            return
        if kind in POSTGRES_STOPS and not self.cluster.postgres.child.alive():
            self.cluster.postgres.start()
        elif kind == "redis_kill" and not self.cluster.redis.child.alive():
            self.cluster.redis.start()
        elif kind.startswith("s3_down"):
            self.cluster.s3.proxy.up()
        self._ended(active)

    def _ended(self, active: _Active) -> None:
        self._active.remove(active)
        self.log.append(FaultRecord(active.spec.kind, active.target, active.started_at, time.time(), active.detail))

    def _target(self, kind: str) -> str:
        if kind in ("kill_gpu", "kill_one_gpu", "sigterm_gpu"):
            return self._rng.choice(self.deployment.gpu_names())
        if kind.startswith("kill_"):
            return kind.removeprefix("kill_")
        return {"pg_stop": "postgres", "pg_stop_renewal": "postgres", "redis_kill": "redis"}.get(kind, "s3")
