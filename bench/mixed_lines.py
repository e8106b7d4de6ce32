"""Issue 37's `mixed-lines` part: a batch mixing text, tool and image lines through Backfill vs the same lines
through vLLM's run-batch (`python -m vllm.entrypoints.openai.run_batch`), the same engine settings on both sides.

Lines (`/v1/chat/completions`, shaped after the corpus's, tests/data/corpus/):
- text: a system prompt and a question (the OpenAI Batch guide's shape);
- tool: vLLM's own run-batch test line (get_current_weather) with `tool_choice: "auto"`;
- image: Azure's batch guide line with its 24x24 PNG as a data URL (no network here), on the vision-language demo
  model (`backfill-demo-vl`).
Every line asks for `--tokens` output tokens (`ignore_eos`), so both sides generate the same tokens.

Which kinds run is probed first: a few lines of each kind through Backfill; a kind whose probe lines do not all
succeed (its feature not yet served, or its model not in the embedded default) is left out and named in the result
(`kinds`, `kinds_left_out`).

Sides, each in its own processes, one after the other:
- Backfill: `backfill serve` with the embedded default's registry entries for the demo models (their parsers and
  structured-outputs settings), `max_num_seqs`, `max_model_len` 2048, float32, eager, the same KV cache size. One file
  per model (OpenAI's rule: one model per file), uploaded and created at once; the clock runs from the first upload
  to the last output file downloaded, the server already up (its start-up excluded).
- run-batch: once per model file with the matching flags (`--tool-call-parser`, `--enable-auto-tool-choice`,
  `--reasoning-parser`, `--structured-outputs-config`); its work is read from its log, "Reading batch from" to
  "Writing outputs to" (start-ups and shut-downs excluded), summed over the files.
The ratio is run-batch's seconds ÷ Backfill's (goal >= 1.0: Backfill at least as fast).

Usage: .venv/bin/python bench/mixed_lines.py [--lines 600] [--tokens 32] [--max-num-seqs 64]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._setup import OUT
from bench.runbatch import Server, engine_env, run_batch, run_job, write_jsonl

TEXT_MODEL, VISION_MODEL = "backfill-demo", "backfill-demo-vl"
KINDS = ("text", "tool", "image")
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_current_weather",
        "description": "Get the current weather in a given location",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string", "description": "The city and state, e.g. San Francisco, CA"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["location"],
        },
    },
}
# Azure OpenAI's batch guide, "Input with base64 encoded image" (tests/data/corpus/openai.jsonl).
_CORPUS = Path(__file__).resolve().parents[1] / "tests" / "data" / "corpus" / "openai.jsonl"


def _azure_image() -> str:
    for text in _CORPUS.read_text().splitlines():
        request = json.loads(text)["request"]
        for message in request.get("body", {}).get("messages", []):
            for part in message.get("content") if isinstance(message.get("content"), list) else []:
                url = (part.get("image_url") or {}).get("url", "")
                if url.startswith("data:image/png"):
                    return str(url)
    raise RuntimeError(f"no data-URL PNG in {_CORPUS}")


def line(kind: str, n: int, tokens: int, image: str) -> dict[str, Any]:
    """One line of `kind`, the n-th (its question varies so no two prompts are the same)."""
    body: dict[str, Any] = {"max_tokens": tokens, "ignore_eos": True}
    if kind == "text":
        body |= {
            "model": TEXT_MODEL,
            "messages": [
                {"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": f"Hello world! Question {n}: what is {n} + {n}?"},
            ],
        }
    elif kind == "tool":
        body |= {
            "model": TEXT_MODEL,
            "messages": [{"role": "user", "content": f"What is the weather in San Francisco on day {n}?"}],
            "tools": [WEATHER],
            "tool_choice": "auto",
        }
    else:
        body |= {
            "model": VISION_MODEL,
            "messages": [
                {"role": "system", "content": "You are a helpful assistant."},
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": f"Describe this picture ({n}):"},
                        {"type": "image_url", "image_url": {"url": image}},
                    ],
                },
            ],
        }
    return {"custom_id": f"{kind}-{n}", "method": "POST", "url": "/v1/chat/completions", "body": body}


def registry(max_num_seqs: int) -> dict[str, dict[str, Any]]:
    """The embedded default's entries for the demo generation models (built under bench/out/models), with this
    bench's engine settings."""
    from storage.settings import Settings

    models = OUT / "models"
    served = Settings(data_dir=models.parent).served_models()  # type: ignore[call-arg]
    entries = {}
    for name in (TEXT_MODEL, VISION_MODEL):
        if name not in served:
            continue
        spec = served[name].model_dump(exclude_defaults=True)
        spec |= {"max_num_seqs": max_num_seqs, "max_model_len": 2048, "dtype": "float32"}
        entries[name] = spec
    _build(entries)
    return entries


def _build(entries: dict[str, dict[str, Any]]) -> None:
    from worker.engine.demo_model import build_demo_model

    build_demo_model(Path(entries[TEXT_MODEL]["path"]))
    if VISION_MODEL in entries:
        from worker.engine.demo_vl_model import build_demo_vl_model

        build_demo_vl_model(Path(entries[VISION_MODEL]["path"]))


def runbatch_flags(spec: dict[str, Any]) -> list[str]:
    """run-batch's flags for the engine settings a registry entry sets beyond the common ones."""
    from storage.registry import ModelSpec

    model = ModelSpec(**spec)
    flags = ["--max-num-seqs", str(model.max_num_seqs), "--max-model-len", str(model.max_model_len)]
    if model.tool_parser:
        flags += ["--enable-auto-tool-choice", "--tool-call-parser", model.tool_parser]
    if model.reasoning_parser:
        flags += ["--reasoning-parser", model.reasoning_parser]
    extra = model.engine_extra()
    if "structured_outputs_config" in extra:
        flags += ["--structured-outputs-config", json.dumps(extra.pop("structured_outputs_config"))]
    for name, value in extra.items():  # anything else the entry hands vLLM, as run-batch's flag of that name
        flag = "--" + name.replace("_", "-")
        flags += [flag] if value is True else [flag, json.dumps(value) if isinstance(value, dict) else str(value)]
    return flags


def probe(server: Server, work: Path, models: dict[str, dict[str, Any]], image: str) -> dict[str, str]:
    """Each kind's probe (3 lines) through the running server: '' if all succeeded, else why not."""
    verdicts = {}
    for kind in KINDS:
        model = VISION_MODEL if kind == "image" else TEXT_MODEL
        if model not in models:
            verdicts[kind] = f"{model} is not in the embedded default's registry"
            continue
        lines = [line(kind, 100_000 + n, 4, image) for n in range(3)]
        done = run_job(server.client(0), write_jsonl(work / f"probe-{kind}.jsonl", lines))
        if done["ok"] == len(lines):
            verdicts[kind] = ""
            continue
        errors = server.client(0).batches.list(limit=1).data[0]
        reason = f"{done['ok']} of {len(lines)} probe lines succeeded (batch {done['status']})"
        if errors.error_file_id:
            first = server.client(0).files.content(errors.error_file_id).text.splitlines()[:1]
            if first:
                problem = (json.loads(first[0]).get("response") or {}).get("body", {}).get("error", {})
                reason += f": {problem.get('code')}: {problem.get('message')}"
        verdicts[kind] = reason[:300]
    return verdicts


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=600, help="lines in all, shared evenly by the kinds that run")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--max-num-seqs", type=int, default=64)
    args = parser.parse_args()
    OUT.mkdir(exist_ok=True)
    env = engine_env()
    models = registry(args.max_num_seqs)
    image = _azure_image()
    work = Path(tempfile.mkdtemp(prefix="mixed-lines-", dir=OUT))

    server = Server(Path(models[TEXT_MODEL]["path"]), args.max_num_seqs, 1, env=env, registry=models)
    try:
        verdicts = probe(server, work, models, image)
        kinds = [kind for kind in KINDS if not verdicts[kind]]
        print(json.dumps({"probe": verdicts}), flush=True)
        if not kinds:
            raise RuntimeError(f"no kind of line runs: {verdicts}")
        each = max(1, args.lines // len(kinds))
        files: dict[str, Path] = {}
        for model in (TEXT_MODEL, VISION_MODEL):
            mine = [k for k in kinds if (k == "image") == (model == VISION_MODEL)]
            if mine:
                lines = [line(kind, n, args.tokens, image) for n in range(each) for kind in mine]
                files[model] = write_jsonl(work / f"{model}.jsonl", lines)
        started = time.perf_counter()
        with cf.ThreadPoolExecutor(max_workers=len(files)) as pool:
            jobs = dict(zip(files, pool.map(lambda path: run_job(server.client(0), path), files.values()), strict=True))
        backfill_seconds = time.perf_counter() - started
        print(
            json.dumps(
                {
                    "backfill_seconds": backfill_seconds,
                    "jobs": {m: {k: v for k, v in j.items() if k != "custom_ids"} for m, j in jobs.items()},
                }
            ),
            flush=True,
        )
    finally:
        server.stop()

    runs = {}
    for model, path in files.items():
        flags = ["--served-model-name", model, *runbatch_flags(models[model])]
        run = run_batch(Path(models[model]["path"]), path, args.max_num_seqs, extra=flags, env=env)
        run.pop("output")
        runs[model] = run
        print(json.dumps({"run_batch": {model: run}}), flush=True)
    if any(run["work_seconds"] is None for run in runs.values()):
        raise RuntimeError("run-batch's log lacks 'Reading batch from' or 'Writing outputs to': no work time")
    run_batch_seconds = sum(run["work_seconds"] for run in runs.values())
    total = sum(len(path.read_text().splitlines()) for path in files.values())
    result = {
        "kinds": kinds,
        "kinds_left_out": {kind: why for kind, why in verdicts.items() if why},
        "lines": total,
        "lines_per_kind": each,
        "output_tokens_each": args.tokens,
        "max_num_seqs": args.max_num_seqs,
        "models": {model: runbatch_flags(models[model]) for model in files},
        "backfill_seconds": round(backfill_seconds, 2),
        "backfill_ready_seconds": round(server.ready_seconds, 2),
        "run_batch_seconds": round(run_batch_seconds, 2),
        "run_batch_startup_and_shutdown_seconds": {
            m: round(r["seconds"] - r["work_seconds"], 2) for m, r in runs.items()
        },
        "speedup": round(run_batch_seconds / backfill_seconds, 3),
        "backfill_all_ok": all(j["status"] == "completed" for j in jobs.values())
        and sum(j["ok"] for j in jobs.values()) == total,
        "run_batch_all_ok": sum(r["ok"] for r in runs.values()) == total,
    }
    print(json.dumps(result, indent=2))
    (OUT / "mixed-lines.json").write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
