"""One chaos run: a fresh database, Redis db and bucket, the Backfill processes, the workload, the faults,
then the history read back and checked.

The main thread runs the injector (it restarts processes); tenants run in threads of their own.
"""

from __future__ import annotations

import json
import random
import shutil
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import openai
import redis
import sqlalchemy as sa

from storage.models import Batch, BatchRequest, File
from tests.chaos.adapters import ADAPTERS, adapter_folders, lora_spec, name_adapters
from tests.chaos.control import run_tenant
from tests.chaos.control_rules import cap_overruns
from tests.chaos.decode_rules import decode_summary, record_decode
from tests.chaos.deployment import MODEL, Deployment, EngineKind, Timing, backfill_env, cli, create_keys, vllm_env
from tests.chaos.faults import Injector, Probe, Scenario, scenario_for
from tests.chaos.history import BUDGET_CODE, ControlEvent, History, RowRecord, Verdict, check, error_code
from tests.chaos.services import Cluster
from tests.chaos.workflow import plan_workflow, read_merged, record_generations, workflow_env
from tests.chaos.workflow_rules import workflow_counts
from tests.chaos.workload import (
    SIZES,
    USD_PER_OUTPUT_TOKEN,
    BudgetPlan,
    GaveUp,
    PlannedBatch,
    TenantClient,
    collect_unknown,
    plan_budget,
    plan_workload,
)

TEMPLATE_DB = "chaos_template"
LEDGER = "ledger"  # the GPU workers' decode ledgers, under the run's directory (tests/chaos/decode_rules.py)
ADMIN = "chaos-admin"  # the admin key's tenant: it sets the other tenants' budgets
# The stated overrun bound of a tenant budget (docs/decisions/0018): per GPU worker 2 x max_num_seqs x
# inflight_per_seq requests (the chaos engine's 8 sequences, the default 2 per sequence). A batch's cap: one request.
INFLIGHT_BOUND_PER_WORKER = 2 * 8 * 2


@dataclass(frozen=True)
class RunOptions:
    engine: EngineKind = "fake"
    size: str = "default"
    timing: Timing = field(default_factory=Timing)
    # A batch must be terminal this long after the last fault was repaired. The real engine on these shared
    # CPUs is much slower than the fake one, so it gets longer.
    stuck_bound_seconds: float | None = None  # None: 60 s (fake), 180 s (vllm)
    max_seconds: float = 420.0  # a run that takes longer is cut short (its open batches count as stuck)

    @property
    def stuck_bound(self) -> float:
        if self.stuck_bound_seconds is not None:
            return self.stuck_bound_seconds
        return 60.0 if self.engine == "fake" else 180.0

    keep_database: bool = False
    adapters: bool = False  # lines name the base or one of three LoRA adapters (tests/chaos/adapters.py)
    workflow: bool = False  # trials, checks, short windows with continuation (tests/chaos/workflow.py)


@dataclass
class RunReport:
    seed: int
    scenario: str
    engine: str
    faults: str
    summary: dict[str, int]
    findings: list[dict[str, Any]]
    seconds: float
    client_retries: int
    requests: int
    run_dir: str
    controls: dict[str, int] = field(default_factory=dict)
    decode: dict[str, Any] = field(default_factory=dict)  # tests/chaos/decode_rules.py decode_summary

    @property
    def ok(self) -> bool:
        return not self.findings


def prepare_template(cluster: Cluster) -> None:
    """A migrated database each run copies (CREATE DATABASE … TEMPLATE is much faster than migrating)."""
    cluster.postgres.admin(f'DROP DATABASE IF EXISTS "{TEMPLATE_DB}"')
    cluster.postgres.admin(f'CREATE DATABASE "{TEMPLATE_DB}"')
    cli("migrate", env={"BACKFILL_DATABASE_URL": cluster.postgres.url(TEMPLATE_DB)}, timeout=120)


@dataclass
class Stage:
    """One run's private slice of the cluster, with the Backfill processes running on it."""

    cluster: Cluster
    env: dict[str, str]
    deployment: Deployment
    keys: dict[str, str]
    probe: Probe
    database: str
    bucket: str

    def rows(self) -> dict[str, list[RowRecord]]:
        """Every request row at the end of the run, by batch (for the control rules: when results landed)."""
        query = sa.select(
            BatchRequest.batch_id,
            BatchRequest.custom_id,
            BatchRequest.status,
            BatchRequest.finished_at,
            BatchRequest.run_id,
            BatchRequest.error_code,
            BatchRequest.completion_tokens,
            BatchRequest.trial,
            BatchRequest.id,
            BatchRequest.copy_of,
        )
        found: dict[str, list[RowRecord]] = {}
        with self.probe.engine.connect() as conn:
            for batch_id, *row in conn.execute(query):
                found.setdefault(batch_id, []).append(RowRecord(*row))
        return found

    def client(self, tenant: str, *, timeout: float = 15) -> openai.OpenAI:
        """The official SDK for one tenant, with no retries of its own."""
        return openai.OpenAI(
            api_key=self.keys[tenant], base_url=f"{self.deployment.base_url}/v1", max_retries=0, timeout=timeout
        )

    def file_keys(self) -> dict[str, str]:
        """blob_key -> owner for every object a row owns: live file rows, and batches' manifests."""
        files = sa.select(File.blob_key, File.id).where(File.deleted_at.is_(None))
        manifests = sa.select(Batch.manifest_key, Batch.id).where(Batch.manifest_key.is_not(None))
        with self.probe.engine.connect() as conn:
            owned = {key: file_id for key, file_id in conn.execute(files)}
            owned.update((key, f"manifest of {batch_id}") for key, batch_id in conn.execute(manifests))
            return owned


@contextmanager
def staged(
    cluster: Cluster,
    *,
    run_dir: Path,
    label: str,
    tenants: list[str],
    engine: EngineKind = "fake",
    timing: Timing | None = None,
    gpu_workers: int = 1,
    planned_requests: int = 1,
    keep_database: bool = False,
    adapters: bool = False,
    extra_env: dict[str, str] | None = None,
) -> Iterator[Stage]:
    """A fresh database (from the migrated template), Redis db and bucket; API keys; the processes started.

    Everything is killed and the database dropped on the way out, whatever happened inside.
    """
    suffix = uuid.uuid4().hex[:6]
    database, bucket = f"chaos_{label}_{suffix}", f"chaos-{label}-{suffix}".replace("_", "-")
    cluster.postgres.admin(f'CREATE DATABASE "{database}" TEMPLATE "{TEMPLATE_DB}"')
    cluster.s3.client().create_bucket(Bucket=bucket)  # type: ignore[attr-defined]
    redis.Redis.from_url(cluster.redis.url()).flushall()
    env = backfill_env(
        cluster,
        database=database,
        redis_db=0,
        bucket=bucket,
        data_dir=run_dir / "data",
        engine=engine,
        timing=timing or Timing(),
        demo_model_cache=cluster.cache,
        ledger_dir=run_dir / LEDGER if engine == "fake" else None,
        lora=lora_spec(adapter_folders(cluster.cache)) if adapters else None,
    )
    if engine == "vllm":
        env.update(vllm_env(cluster.cache))
    env.update(extra_env or {})
    deployment = Deployment(env, run_dir / "logs", gpu_workers=gpu_workers)
    probe = Probe(env["BACKFILL_DATABASE_URL"], planned_requests=planned_requests)
    try:
        keys = create_keys(tenants, env=env, admin=ADMIN)
        deployment.start()
        yield Stage(cluster, env, deployment, keys, probe, database, bucket)
    finally:
        deployment.stop()
        probe.close()
        if not cluster.postgres.child.alive():
            cluster.postgres.start()
        if not cluster.redis.child.alive():
            cluster.redis.start()
        cluster.s3.proxy.up()
        if not keep_database:
            cluster.postgres.admin(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


def run_seed(
    cluster: Cluster, seed: int, *, out: Path, options: RunOptions, scenario: Scenario | None = None
) -> tuple[RunReport, History]:
    """Run one seed end to end and check it; the processes are gone when this returns."""
    scenario = scenario or scenario_for(seed)
    run_dir = out / f"seed-{seed:04d}-{_name(scenario, options)}-{options.engine}"
    run_dir.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(run_dir / LEDGER, ignore_errors=True)  # a replay of the seed in the same directory starts afresh
    plan = plan_workload(random.Random(f"workload/{seed}"), model=MODEL, size=SIZES[options.size])
    budget = plan_budget(random.Random(f"budget/{seed}"), size=SIZES[options.size])
    if options.adapters:
        plan = name_adapters(plan, random.Random(f"adapters/{seed}"), base=MODEL)
    if options.workflow:
        plan = plan_workflow(plan, random.Random(f"workflow/{seed}"))
    history = History(
        seed=seed,
        scenario=scenario.name,
        started_at=time.time(),
        usd_per_output_token=USD_PER_OUTPUT_TOKEN,
        gpu_workers=scenario.gpu_workers,
        inflight_bound_per_worker=INFLIGHT_BOUND_PER_WORKER,
        checkpoint_bound_tokens=options.timing.checkpoint_bound_tokens(),
        adapters=ADAPTERS if options.adapters else (),
        adapter_answers_alike=options.adapters and options.engine == "fake",
    )
    with staged(
        cluster,
        run_dir=run_dir,
        label=str(seed),
        tenants=sorted({p.tenant for p in plan}),
        engine=options.engine,
        timing=options.timing,
        gpu_workers=scenario.gpu_workers,
        planned_requests=sum(len(p.lines) for p in plan),
        keep_database=options.keep_database,
        adapters=options.adapters,
        extra_env=workflow_env() if options.workflow else None,
    ) as stage:
        history.started_at = time.time()
        injector = Injector(scenario, stage.deployment, cluster, stage.probe, started_at=history.started_at)
        try:
            clients = _drive(history, plan, stage, injector, options, budget)
        finally:
            history.faults = injector.log
        for client in clients.values():
            try:
                collect_unknown(client, records=history.batches, give_up_at=time.time() + 30)
            except GaveUp:
                pass
            history.client_events += client.events
        if options.workflow:
            read_merged(clients, history, give_up_at=time.time() + 30)
        history.rows = stage.rows()
        history.objects = cluster.s3.keys(stage.bucket)
        history.file_keys = stage.file_keys()
    record_decode(history, run_dir / LEDGER)  # the processes are gone: every ledger line is written
    record_generations(history, run_dir / LEDGER)
    verdict = check(history, stuck_bound_seconds=options.stuck_bound)
    report = _report(seed, scenario, options, history, verdict, run_dir, seconds=time.time() - history.started_at)
    (run_dir / "history.json").write_text(json.dumps(history.to_json(), indent=1, default=str))
    (run_dir / "report.json").write_text(json.dumps(asdict(report), indent=1))
    return report, history


def _drive(
    history: History,
    plan: list[PlannedBatch],
    stage: Stage,
    injector: Injector,
    options: RunOptions,
    budget: BudgetPlan | None,
) -> dict[str, TenantClient]:
    """Run the tenants in threads while the main thread injects faults; stop them once the run is over."""
    stop = threading.Event()
    lock = threading.Lock()
    give_up_at = history.started_at + options.max_seconds
    clients = {tenant: TenantClient(tenant, stage.client(tenant), stop) for tenant in stage.keys}
    admin = clients.pop(ADMIN)

    def log(event: ControlEvent) -> None:
        with lock:
            history.controls.append(event)

    threads = [
        threading.Thread(
            target=run_tenant,
            args=(clients[tenant], [p for p in plan if p.tenant == tenant]),
            kwargs={
                "started_at": history.started_at,
                "give_up_at": give_up_at,
                "inputs": history.inputs,
                "records": history.batches,
                "lock": lock,
                "log": log,
                "budget": budget if budget is not None and budget.tenant == tenant else None,
                "admin": admin,
            },
            name=f"chaos-{tenant}",
            daemon=True,
        )
        for tenant in clients
    ]
    for thread in threads:
        thread.start()
    while any(thread.is_alive() for thread in threads):
        injector.tick()
        history.faults = injector.log
        now = time.time()
        if now > give_up_at or (injector.done and now > history.faults_over_at + options.stuck_bound + 5):
            stop.set()  # whatever is still open now is stuck; the checker says so
        time.sleep(0.1)
    for thread in threads:
        thread.join()
    injector.repair_all()
    if not stage.deployment.children["api"].alive():
        stage.deployment.restart("api")
    stage.deployment.wait_healthy(timeout=30)
    return {**clients, ADMIN: admin}


def _name(scenario: Scenario, options: RunOptions) -> str:
    return scenario.name + ("+lora" if options.adapters else "") + ("+wf" if options.workflow else "")


def _report(
    seed: int,
    scenario: Scenario,
    options: RunOptions,
    history: History,
    verdict: Verdict,
    run_dir: Path,
    *,
    seconds: float,
) -> RunReport:
    return RunReport(
        seed=seed,
        scenario=_name(scenario, options),
        engine=options.engine,
        faults=", ".join(f"{f.kind}@{f.started_at - history.started_at:.1f}s" for f in history.faults) or "-",
        summary=verdict.summary(),
        findings=[asdict(finding) for finding in verdict.findings],
        seconds=round(seconds, 1),
        client_retries=len(history.client_events),
        requests=sum(len(f.lines) for f in history.inputs.values()),
        run_dir=str(run_dir),
        controls=control_counts(history),
        decode=decode_summary(history),
    )


def control_counts(history: History) -> dict[str, int]:
    """How much control the run exercised: calls that took effect, and the batches a cap or budget stopped."""
    done = Counter(event.kind for event in history.controls if event.outcome == "ok")
    refused = Counter(event.kind for event in history.controls if event.outcome != "ok")
    overruns = cap_overruns(history)
    stopped = [
        record
        for record in history.batches.values()
        if any(error_code(line) == BUDGET_CODE for line in record.error_lines)
    ]
    return {
        **workflow_counts(history),
        "pause": done["pause"],
        "resume": done["resume"],
        "priority": done["priority"],
        "retry": done["retry"],
        "budget": done["budget"],
        "refused": sum(refused.values()),
        "cap_stops": sum(1 for record in stopped if record.max_cost_usd is not None),
        # The measured side of the overrun rule: the most a capped batch billed past its cap (whole USD), and that
        # as a percentage of the batch's dearest request (the bound: 100).
        "cap_overrun_max": int(max((o for o, _ in overruns.values()), default=Decimal(0))),
        "cap_overrun_max_pct": max((int(100 * o / d) for o, d in overruns.values() if d), default=0),
        "budget_stops": sum(1 for record in stopped if record.max_cost_usd is None),
        "paused_results_checked": sum(
            1
            for batch_id in {e.batch_id for e in history.controls if e.kind == "pause" and e.batch_id}
            for row in history.rows.get(batch_id, [])
            if row.run_id is not None
        ),
    }
