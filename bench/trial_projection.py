"""A trial's projected cost against what the whole batch then cost (issue 40 §1), on the fake engine.

A batch of `--lines` chat lines is created with `trial: {"lines": --trial}`; a runner on the fake engine runs the
trial, which reports and pauses the batch; the batch is resumed and run to its end; its billed cost
(storage/finance/budgets.py `batch_spend`) is set against the trial's projection and interval. File shapes
(`--shapes`):

* `uniform`: prompts of 5-60 words, output budgets 8-64 tokens, uniformly;
* `skewed`: a seeded log-normal spread of prompts and output budgets (1..512: a few lines cost 10-50x the median);
* `growing`: the skewed spread with every line's budget scaled by 0.25 + 1.5 x its position (lines get longer
  towards the end of the file: a trial of the file's head would miss it);
* `skewed-v1`: the skewed spread drawn as the first measurement drew it (seeds 1-5 and 7 of docs/workflow.md);
* `short`: short answers as real files often ask for them: a log-normal spread of prompts (1-300 words) and of
  output budgets (1..64 tokens, median about 10), sampled at temperature 1.

`--engine demo` runs the batch on the real vLLM engine instead, the embedded default's demo model (float32, as
`make run` serves it; built under bench/out/models): a real tokenizer and chat template, answers that may stop
before their budget. Its output is bench/out/trial-projection-real.json (`make bench ARGS="--only
trial-projection-real"`: one 5,000-line `short` file, a 50-line trial, about 5 minutes on 2 cores).

Each (shape, seed) is one file and one batch; coverage is the share of batches whose actual cost fell inside the
trial's interval (the goal: about 0.95). Every line's actual and stated cost is kept (`--dump`), so the interval
can be recomputed on the same lines (`--from-dump`: the server's `projected_cost` on the same trial positions, the
very computation the trial makes, without running the engine again). Writes bench/out/trial-projection.json:

    .venv/bin/python bench/trial_projection.py [--lines 5000] [--trial 50] [--shapes uniform,skewed,growing]
        [--seeds 0-19] [--dump bench/out/trial-lines.json] [--from-dump bench/out/trial-lines.json]
        [--engine fake|demo] [--max-num-seqs 64]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MODEL = "backfill-demo"
OUT = Path(__file__).resolve().parent / "out" / "trial-projection.json"
OUT_REAL = OUT.with_name("trial-projection-real.json")
SHAPES = ("uniform", "skewed", "growing")


def lines(count: int, seed: int, shape: str = "skewed") -> list[dict[str, Any]]:
    """Chat lines of one shape (the module docstring): the spread a projection must cope with."""
    rng = random.Random(seed if shape == "skewed-v1" else f"{shape}/{seed}")  # v1: the first measurement's files
    rows = []
    for i in range(count):
        extra: dict[str, Any] = {}
        if shape == "uniform":
            words, budget = rng.randint(5, 60), rng.randint(8, 64)
        elif shape == "short":
            words = max(1, min(300, int(rng.lognormvariate(3.0, 0.9))))
            budget = max(1, min(64, int(rng.lognormvariate(2.3, 0.8))))
            extra = {"temperature": 1.0}
        else:
            words = max(1, int(rng.lognormvariate(3.0, 0.8)))
            budget = max(1, min(512, int(rng.lognormvariate(3.5, 0.9))))
            if shape == "growing":
                budget = max(1, min(512, int(budget * (0.25 + 1.5 * i / count))))
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": " ".join(["word"] * words)}],
            "max_tokens": budget,
            **extra,
        }
        rows.append({"custom_id": f"l{i}", "method": "POST", "url": "/v1/chat/completions", "body": body})
    return rows


def _seeds(text: str) -> list[int]:
    seeds: list[int] = []
    for part in filter(None, text.split(",")):
        first, _, last = part.partition("-")
        seeds += range(int(first), int(last or first) + 1)
    return seeds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, default=5000)
    parser.add_argument("--trial", type=int, default=50)
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--seeds", default="0-19")
    parser.add_argument("--dump", type=Path, default=None, help="keep every line's actual and stated cost here")
    parser.add_argument("--from-dump", type=Path, default=None, help="recompute the intervals on dumped lines")
    parser.add_argument("--out", type=Path, default=None, help="default: bench/out/trial-projection(-real).json")
    parser.add_argument("--engine", choices=("fake", "demo"), default="fake", help="demo: the real vLLM demo model")
    parser.add_argument("--max-num-seqs", type=int, default=64)
    args = parser.parse_args()
    args.out = args.out or (OUT_REAL if args.engine == "demo" else OUT)
    if args.from_dump is not None:
        runs = [reproject(run) for run in json.loads(args.from_dump.read_text())]
    else:
        engine = _engine(args.engine, args.max_num_seqs)
        runs = []
        for shape in args.shapes.split(","):
            for seed in _seeds(args.seeds):
                rows = lines(args.lines, seed, shape)
                runs.append({"shape": shape, "seed": seed, "engine": args.engine, **run(rows, args.trial, engine)})
                print(json.dumps({k: v for k, v in runs[-1].items() if k != "per_line"}), flush=True)
        engine.close()
        if args.dump is not None:
            args.dump.parent.mkdir(parents=True, exist_ok=True)
            args.dump.write_text(json.dumps(runs))
    result = summary(runs)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "all"}, indent=1))
    return 0


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Coverage and errors per shape, and the headline 5,000-line batch of each (its first seed)."""
    shapes: dict[str, Any] = {}
    for shape in dict.fromkeys(run["shape"] for run in runs):
        mine = [run for run in runs if run["shape"] == shape]
        inside = sum(1 for run in mine if run["actual_within_interval"])
        shapes[shape] = {
            "runs": len(mine),
            "inside": inside,
            "coverage": round(inside / len(mine), 3),
            "error_pct_max_abs": max(abs(run["error_pct"]) for run in mine),
            "half_width_pct_median": sorted(run["half_width_pct"] for run in mine)[len(mine) // 2],
            "first": {k: v for k, v in mine[0].items() if k != "per_line"},
        }
    inside = sum(shape["inside"] for shape in shapes.values())
    return {
        "coverage": round(inside / len(runs), 3) if runs else None,
        "runs": len(runs),
        "shapes": shapes,
        "all": [{k: v for k, v in run.items() if k != "per_line"} for run in runs],
    }


def reproject(saved: dict[str, Any]) -> dict[str, Any]:
    """The trial's projection on a dumped batch's lines again, with the server's code as it is now."""
    from storage.batches.trial_reports import projected_cost
    from storage.batches.trials import sample_positions

    per_line = saved["per_line"]
    actual_line = [Decimal(cost) for cost, _ in per_line]
    stated_line = [Decimal(stated) for _, stated in per_line]
    picked = sample_positions(len(per_line), saved["trial_lines"])
    projected = projected_cost(
        [actual_line[i] for i in picked],
        total_lines=len(per_line),
        stated=([stated_line[i] for i in picked], sum(stated_line, Decimal(0))),
    )
    return {**saved, **_compare(projected, Decimal(saved["actual_usd"]))}


def _compare(projected: dict[str, Any], actual: Decimal) -> dict[str, Any]:
    estimate, low, high = (Decimal(projected[key]) for key in ("estimate_usd", "low_usd", "high_usd"))
    return {
        "projected_usd": projected["estimate_usd"],
        "interval_usd": [projected["low_usd"], projected["high_usd"]],
        "error_pct": round(float((estimate - actual) / actual * 100), 2),
        "half_width_pct": round(float((high - low) / 2 / actual * 100), 2),
        "actual_within_interval": low <= actual <= high,
    }


def _engine(kind: str, max_num_seqs: int) -> Any:
    """A throwaway embedded Backfill (SQLite) and the engine its runner feeds: the fake, or the embedded default's
    demo model on the real vLLM engine."""
    if kind == "fake":
        os.environ.update(
            BACKFILL_DATA_DIR=tempfile.mkdtemp(prefix="bench-trial-"),
            BACKFILL_MODELS=json.dumps({MODEL: {"path": "fake:", "max_num_seqs": max_num_seqs, "max_model_len": 4096}}),
        )
    else:
        from bench._setup import prepare_env
        from storage.settings import Settings

        model_dir = prepare_env(max_num_seqs=max_num_seqs)
        served = Settings(data_dir=model_dir.parents[1]).served_models()[MODEL]  # type: ignore[call-arg]
        spec = served.model_dump(exclude_defaults=True) | {
            "path": str(model_dir),
            "max_num_seqs": max_num_seqs,
            "max_model_len": 1024,
        }
        os.environ["BACKFILL_MODELS"] = json.dumps({MODEL: spec})
    from storage.settings import get_settings
    from worker.cli.migrate import migrate_database
    from worker.engine.factory import load_engine

    get_settings.cache_clear()
    migrate_database()
    return load_engine(get_settings(), MODEL)


def run(rows: list[dict[str, Any]], trial: int, engine: Any) -> dict[str, Any]:
    from storage.batches.batches import create_batch, get_batch
    from storage.batches.checks import attach_workflow
    from storage.batches.control import resume_batch
    from storage.db import transaction
    from storage.files.blobs import get_blob_store
    from storage.files.files import create_file
    from storage.finance.budgets import batch_spend
    from storage.settings import get_settings
    from storage.tenants import get_or_create_tenant
    from worker.feed.runner import Runner
    from worker.jobs.ingest import ingest_batch

    settings = get_settings()
    started = time.monotonic()
    with transaction() as session:
        tenant = get_or_create_tenant(session, name="bench").id
        chunks = (json.dumps(row).encode() + b"\n" for row in rows)
        source = create_file(
            session, get_blob_store(), tenant_id=tenant, filename="b.jsonl", purpose="batch", chunks=chunks
        )
        batch = create_batch(
            session, tenant_id=tenant, input_file_id=source.id, endpoint="/v1/chat/completions",
            completion_window="24h", model=MODEL, metadata=None,
        )  # fmt: skip
        attach_workflow(batch, trial={"lines": trial, "continue": "manual", "min_success_rate": 0.95}, checks=None)
        batch_id = batch.id
    with transaction() as session:
        ingest_batch(session, get_blob_store(), settings, batch_id=batch_id)
    runner = Runner(engine, model=MODEL, settings=settings)
    while runner.run_for(5.0):
        with transaction() as session:
            if get_batch(session, tenant_id=None, batch_id=batch_id).trial_status == "reported":
                break
    with transaction() as session:
        report = get_batch(session, tenant_id=None, batch_id=batch_id).trial["report"]  # type: ignore[index]
        trial_spend = batch_spend(session, settings, batch=get_batch(session, tenant_id=None, batch_id=batch_id))
        resume_batch(session, tenant_id=tenant, batch_id=batch_id)
    while runner.run_for(30.0):
        pass
    runner.close_io()
    with transaction() as session:
        batch = get_batch(session, tenant_id=None, batch_id=batch_id)
        actual = batch_spend(session, settings, batch=batch)
        per_line = _line_costs(session, settings, batch=batch)
        tokens = _tokens(session, batch_id=batch_id)
    projected = report["projected_cost"]
    return {
        "seconds": round(time.monotonic() - started, 1),
        "tokens": tokens,
        "lines": len(rows),
        "trial_lines": report["lines_run"],
        "trial_usd": projected["trial_usd"],
        "trial_spend_usd": str(trial_spend.quantize(Decimal("0.000001"))),
        "actual_usd": str(actual.quantize(Decimal("0.000001"))),
        **_compare(projected, actual),
        "per_line": per_line,
    }


def _tokens(session: Any, *, batch_id: str) -> dict[str, Any]:
    """What the batch's lines stated against what they used: on a real engine an answer may stop before its budget,
    and the prompt estimate is not the tokenizer's count."""
    from storage import lifecycle
    from storage.queue.trial_rows import trial_results

    done = [
        r for r in trial_results(session, batch_id=batch_id, trial_only=False) if r.status == lifecycle.REQ_COMPLETED
    ]
    return {
        "completed": len(done),
        "input": sum(r.prompt_tokens for r in done),
        "stated_input": sum(r.stated_input for r in done),
        "output": sum(r.completion_tokens for r in done),
        "stated_output": sum(r.stated_output for r in done),
        "stopped_before_budget": sum(1 for r in done if r.completion_tokens < r.stated_output),
    }


def _line_costs(session: Any, settings: Any, *, batch: Any) -> list[tuple[str, str]]:
    """Every line's billed cost and its cost at what it states up front, priced as the trial prices them."""
    from storage import lifecycle
    from storage.finance.prices import price_book, price_job
    from storage.queue.trial_rows import trial_results

    book = price_book(settings)

    def cost(model: str, tokens_in: int, tokens_out: int, cached: int = 0) -> Decimal:
        return price_job(
            book, model=model, created_at=batch.created_at, completion_window=batch.completion_window,
            input_tokens=tokens_in, output_tokens=tokens_out, busy_seconds=Decimal(0), cached_input_tokens=cached,
        ).billed_usd  # fmt: skip

    return [
        (
            str(cost(r.model, r.prompt_tokens, r.completion_tokens, r.cached_tokens))
            if r.status == lifecycle.REQ_COMPLETED
            else "0",
            str(cost(r.model, r.stated_input, r.stated_output)),
        )
        for r in trial_results(session, batch_id=batch.id, trial_only=False)
    ]


if __name__ == "__main__":
    raise SystemExit(main())
