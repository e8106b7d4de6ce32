"""`make chaos`: many seeded runs, a table of runs x outcomes, and a JSON summary under bench/out/chaos/.

    python -m tests.chaos.main --seeds 0-49 [--vllm-seeds 1,2,9] [--kinds kill_gpu,pg_stop,pg_stop_renewal] [--size small] [--adapters] [--workflow]

Exit status 1 if any run has a finding (lost, duplicated, unexplained, stuck, orphan or other).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, NoReturn

from tests.chaos.decode_rules import class_shares
from tests.chaos.deployment import ROOT, EngineKind
from tests.chaos.faults import ASKED_KINDS, KINDS, scenario_for
from tests.chaos.history import KINDS as OUTCOMES
from tests.chaos.procs import kill_all
from tests.chaos.run import RunOptions, RunReport, prepare_template, run_seed
from tests.chaos.services import Cluster
from tests.chaos.workflow_rules import WORKFLOW_COUNTS

COLUMNS = OUTCOMES
CONTROLS = ("pause", "resume", "priority", "retry", "budget", "cap_stops", "budget_stops")


def parse_seeds(text: str) -> list[int]:
    """'0-49', '3,5,8' or a mix ('0-9,20')."""
    seeds: list[int] = []
    for part in filter(None, text.split(",")):
        first, _, last = part.partition("-")
        seeds += range(int(first), int(last or first) + 1)
    return seeds


def table(reports: list[RunReport]) -> str:
    """One row per run, one column per outcome, and a total row."""
    head = f"{'seed':>4} {'engine':6} {'scenario':17} " + " ".join(f"{c[:6]:>6}" for c in COLUMNS)
    head += (
        f" {'reqs':>5} {'retry':>5} {'secs':>5}  controls (pause/resume/prio/retry/budget/capstop/budgetstop)"
        f" {'discarded/decoded':>17} faults"
    )
    rows = [head]
    for r in reports:
        cells = " ".join(f"{r.summary[c]:>6}" for c in COLUMNS)
        rows.append(
            f"{r.seed:>4} {r.engine:6} {r.scenario:17} {cells} {r.requests:>5} {r.client_retries:>5} "
            f"{r.seconds:>5.0f}  {'/'.join(str(r.controls.get(c, 0)) for c in CONTROLS):>18} "
            f"{_decode_cell(r.decode):>17} {r.faults}"
        )
    totals = " ".join(f"{sum(r.summary[c] for r in reports):>6}" for c in COLUMNS)
    requests = sum(r.requests for r in reports)
    failed = sum(1 for r in reports if not r.ok)
    controls = "/".join(str(sum(r.controls.get(c, 0) for r in reports)) for c in CONTROLS)
    rows.append(
        f"{'all':>4} {'':6} {f'{len(reports)} runs, {failed} bad':17} {totals} {requests:>5} {'':>11} {controls}"
    )
    return "\n".join(rows)


def _decode_cell(decode: dict[str, Any]) -> str:
    return f"{decode['discarded']}/{decode['decoded']} {decode['class'][0]}" if decode else "-"


def decode_lines(shares: dict[str, dict[str, Any]]) -> str:
    """The discard shares over every run of each class (tests/chaos/decode_rules.py), one line each."""
    return "\n".join(
        f"resume_discarded_decode_share_{name}: {s['share']} ({s['discarded']} of {s['decoded']} decode tokens"
        f" discarded, {s['resumed']} resumed from checkpoints, {s['runs']} runs)"
        for name, s in shares.items()
    )


def workflow_line(reports: list[RunReport]) -> str:
    """What the workflow runs exercised, summed (tests/chaos/workflow_rules.py `workflow_counts`)."""
    sums = {name: sum(r.controls.get(name, 0) for r in reports) for name in WORKFLOW_COUNTS}
    return "workflow: " + ", ".join(f"{value} {name.replace('_', ' ')}" for name, value in sums.items())


def cap_line(reports: list[RunReport]) -> str:
    """The spend-cap overrun measured over the runs, against its bound (one request: tests/chaos/control_rules.py)."""
    stops = sum(r.controls.get("cap_stops", 0) for r in reports)
    worst = max((r.controls.get("cap_overrun_max", 0) for r in reports), default=0)
    share = max((r.controls.get("cap_overrun_max_pct", 0) for r in reports), default=0)
    return (
        f"spend caps: {stops} batches stopped by their cap; the most billed past a cap ${worst}; the largest "
        f"overrun {share}% of its batch's dearest request (the bound: 100%)"
    )


def _terminate(signum: int, _frame: object) -> NoReturn:
    kill_all()
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="0-49", help="fake-engine runs, e.g. 0-49 (default) or 3,7")
    parser.add_argument("--vllm-seeds", default="", help="runs on the real vLLM demo model, e.g. 1,2,9")
    parser.add_argument(
        "--kinds", default="", help=f"force these scenario kinds in turn (of {', '.join(KINDS + ASKED_KINDS)})"
    )
    parser.add_argument("--size", default="default", choices=("small", "default", "no-control"))
    parser.add_argument("--vllm-size", default="small", choices=("small", "default"))
    parser.add_argument(
        "--adapters", action="store_true", help="lines name the base or 3 LoRA adapters (docs/chaos.md)"
    )
    parser.add_argument(
        "--workflow", action="store_true", help="trials, checks, short windows with continuation (docs/chaos.md)"
    )
    parser.add_argument("--stuck-bound", type=float, default=None, help="seconds after the faults (60 fake, 180 vllm)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "chaos")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    kinds = [kind for kind in args.kinds.split(",") if kind]
    runs: list[tuple[int, EngineKind]] = [(seed, "fake") for seed in parse_seeds(args.seeds)]
    runs += [(seed, "vllm") for seed in parse_seeds(args.vllm_seeds)]
    stamp = time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"  # two runs started in the same second keep apart
    out = args.out / stamp
    reports: list[RunReport] = []
    cluster = Cluster.start(Path(tempfile.mkdtemp(prefix="backfill-chaos-")), cache=args.out / "cache")
    try:
        prepare_template(cluster)
        for index, (seed, engine) in enumerate(runs):
            kind = kinds[index % len(kinds)] if kinds else None
            size = args.size if engine == "fake" else args.vllm_size
            options = RunOptions(
                engine=engine,
                size=size,
                stuck_bound_seconds=args.stuck_bound,
                adapters=args.adapters,
                workflow=args.workflow,
            )
            report, _ = run_seed(cluster, seed, out=out, options=options, scenario=scenario_for(seed, kind=kind))
            reports.append(report)
            print(table([report]).splitlines()[1], flush=True)
    finally:
        cluster.stop()
        kill_all()
        shutil.rmtree(cluster.root, ignore_errors=True)
    print()
    print(table(reports))
    shares = class_shares([report.decode for report in reports])
    print(decode_lines(shares))
    print(cap_line(reports))
    if args.workflow:
        print(workflow_line(reports))
    summary = {
        "started": stamp,
        "runs": [asdict(report) for report in reports],
        "totals": {c: sum(r.summary[c] for r in reports) for c in COLUMNS},
        "controls": {c: sum(r.controls.get(c, 0) for r in reports) for c in (*CONTROLS, "refused", *WORKFLOW_COUNTS)},
        "cap_overrun_max_usd": max((r.controls.get("cap_overrun_max", 0) for r in reports), default=0),
        "cap_overrun_max_pct": max((r.controls.get("cap_overrun_max_pct", 0) for r in reports), default=0),
        "bad_runs": [r.seed for r in reports if not r.ok],
        "decode": shares,
        "resume_discarded_decode_share_graceful": shares["graceful"]["share"],
        "resume_discarded_decode_share_kill": shares["kill"]["share"],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"summary-{stamp}.json"
    path.write_text(json.dumps(summary, indent=1))
    print(f"\nsummary: {path}\nruns:    {out}")
    return 1 if summary["bad_runs"] else 0


if __name__ == "__main__":
    sys.exit(main())
