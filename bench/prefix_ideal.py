"""The prefix-heavy race's ceiling (issue 22 section 5): bare `vllm.LLM.generate` on the race's lines.

Run by bench/prefix_race.py (`--ideal`) in a fresh process, with the race's engine settings (the demo model,
float32, eager, `max_num_seqs`, `max_num_batched_tokens`, prefix caching on, `kv_cache_memory_bytes`). The
prompts are rendered with the chat template and tokenized before any clock starts; the prefix cache is reset
before each variant, so none helps another:
- `sorted`: every job's lines in one `generate` call, grouped by system prompt (a stable sort): the best any
  scheduler feeding this engine can do, since the engine admits in the order it is given;
- `file_order`: every line in one call, in the jobs' file order (one engine, no grouping);
- `per_job`: one call per job in file order, the prefix cache reset between them: run-batch's work without its
  HTTP layer and start-ups.
Each variant's seconds, steps are not visible here; hit rate = cached prompt tokens / prompt tokens, from each
output's `num_cached_tokens`. `--rounds` repeats the variants (alternating their order) for a spread.

Usage: .venv/bin/python bench/prefix_ideal.py --kv-bytes N --max-num-seqs 16 --max-num-batched-tokens 2048 FILE...
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def load(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line)["body"] for line in path.read_text().splitlines() if line.strip()]


def generate(llm: Any, jobs: list[list[tuple[Any, Any]]]) -> dict[str, Any]:
    """One `generate` call per entry of `jobs` (pairs of token prompt, sampling params), the cache reset first."""
    llm.reset_prefix_cache()
    prompt = cached = tokens = 0
    started = time.perf_counter()
    for job in jobs:
        outputs = llm.generate([p for p, _ in job], [s for _, s in job], use_tqdm=False)
        for output in outputs:
            prompt += len(output.prompt_token_ids)
            cached += output.num_cached_tokens or 0
            tokens += len(output.outputs[0].token_ids)
        if len(jobs) > 1:
            llm.reset_prefix_cache()  # run-batch: a fresh engine per job
    seconds = time.perf_counter() - started
    return {"seconds": round(seconds, 3), "hit_rate": round(cached / prompt, 3), "output_tokens": tokens}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--kv-bytes", type=int, required=True)
    parser.add_argument("--max-num-seqs", type=int, default=16)
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--variants", default="sorted,file_order,per_job")
    args = parser.parse_args()
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(
        model=str(args.model),
        enforce_eager=True,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=2048,
        dtype="float32",
        kv_cache_memory_bytes=args.kv_bytes,
        enable_prefix_caching=True,
    )
    tokenizer = llm.get_tokenizer()

    def prepared(body: dict[str, Any]) -> tuple[Any, Any]:
        text = tokenizer.apply_chat_template(body["messages"], add_generation_prompt=True, tokenize=False)
        ids = tokenizer.encode(text, add_special_tokens=False)  # the template writes BOS itself
        return TokensPrompt(prompt_token_ids=ids), SamplingParams(max_tokens=body["max_tokens"], ignore_eos=True)

    bodies = [load(path) for path in args.files]
    jobs = [[prepared(body) for body in job] for job in bodies]
    systems = [body["messages"][0]["content"] for job in bodies for body in job]
    everything = [pair for job in jobs for pair in job]
    order = sorted(range(len(everything)), key=lambda i: systems.index(systems[i]))
    variants = {
        "sorted": [[everything[i] for i in order]],
        "file_order": [everything],
        "per_job": jobs,
    }
    warm = [(TokensPrompt(prompt_token_ids=[5] * 64), SamplingParams(max_tokens=4, ignore_eos=True))] * 4
    generate(llm, [warm])  # the first call's one-off costs
    names = args.variants.split(",")
    rounds: list[dict[str, Any]] = []
    for index in range(args.rounds):
        measured = {name: generate(llm, variants[name]) for name in (names if index % 2 == 0 else names[::-1])}
        rounds.append(measured)
        print(json.dumps({"ideal_round": measured}), flush=True)
    result = {
        "multiprocessing": os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1"),
        **{name: min((r[name] for r in rounds), key=lambda m: m["seconds"]) for name in names},
        "rounds": rounds,
    }
    print("IDEAL " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
