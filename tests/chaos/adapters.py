"""The chaos runs with LoRA adapters (issue 39, docs/chaos.md "Adapters"): mixed-adapter batches under faults.

`--adapters` (RunOptions.adapters) serves three demo adapters on the chaos model (`worker/engine/demo_adapter.py`:
PEFT folders of the demo model's shapes, so the real vLLM engine loads them too) with `max_loras` 2, so three
adapters and the base share the engine's slots, and has every line of the seed's workload name the base model or
one of the adapters (drawn from the run's own stream: the seed's lines, faults and controls stay what they were).

The history checker then holds the run to one rule more, `adapter`:

* every output line's `model` is the model or adapter its input line named (a line resumed after a kill under
  another adapter, or under none, would answer as that one);
* on the fake engine, whose words under an adapter follow the adapter alone (worker/engine/fake.py), all the
  answers of one adapter are prefixes of its longest one: a sequence resumed from a checkpoint under the wrong
  adapter continues with another adapter's words, which breaks it.
"""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

from tests.chaos.history import Finding, History, Verdict
from tests.chaos.workload import PlannedBatch

# Names whose fake words start at three different words of the fake's eight (worker/engine/fake.py `_start`), so an
# answer resumed under the wrong one of them shows.
ADAPTERS = ("chaos-tone-a", "chaos-tone-b", "chaos-tone-e")
MAX_LORAS = 2  # fewer slots than adapters: the engine swaps them in and out as claims move on


def adapter_folders(cache: Path) -> dict[str, str]:
    """name -> folder of each chaos adapter, built once per cluster (a few milliseconds, numpy only)."""
    from worker.engine.demo_adapter import build_demo_adapter

    return {
        name: str(build_demo_adapter(cache / "adapters" / name, seed=index + 1)) for index, name in enumerate(ADAPTERS)
    }


def lora_spec(folders: dict[str, str]) -> dict[str, object]:
    """What a model's registry entry adds to serve the chaos adapters."""
    return {"enable_lora": True, "max_loras": MAX_LORAS, "max_lora_rank": 8, "adapters": folders}


def name_adapters(plan: list[PlannedBatch], rng: random.Random, *, base: str) -> list[PlannedBatch]:
    """Each line of `plan` naming the base model or one of ADAPTERS (uniformly), its InputLine saying which."""
    choices = (base, *ADAPTERS)
    named = []
    for batch in plan:
        models = [rng.choice(choices) for _ in batch.lines]
        bodies = tuple({**body, "model": model} for body, model in zip(batch.bodies, models, strict=True))
        lines = tuple(replace(line, model=model) for line, model in zip(batch.lines, models, strict=True))
        named.append(replace(batch, lines=lines, bodies=bodies))
    return named


def check_adapters(verdict: Verdict, history: History) -> None:
    """The `adapter` rule (the module docstring)."""
    named = {line.custom_id: line.model for source in history.inputs.values() for line in source.lines if line.model}
    if not named:
        return
    answers: dict[str, list[tuple[str, str]]] = {}
    for record in history.batches.values():
        for line in record.output_lines:
            cid = str(line.get("custom_id"))
            want = named.get(cid)
            body = (line.get("response") or {}).get("body") or {}
            if want is None or not body:
                continue
            if body.get("model") != want:
                message = f"{cid} named {want} but was answered as {body.get('model')}"
                verdict.findings.append(Finding("adapter", record.batch_id, message))
            if want in history.adapters:
                choices = body.get("choices") or [{}]
                text = str(((choices[0] or {}).get("message") or {}).get("content") or "")
                answers.setdefault(want, []).append((record.batch_id, text))
    if not history.adapter_answers_alike:
        return
    for adapter, texts in sorted(answers.items()):
        longest = max((text for _, text in texts), key=len)
        unlike = [(batch_id, text) for batch_id, text in texts if not longest.startswith(text)]
        for batch_id, text in unlike:
            message = f"an answer of {adapter} is not its words: {text[:80]!r} vs {longest[:80]!r}"
            verdict.findings.append(Finding("adapter", batch_id, message))
