"""The checker's `adapter` rule (tests/chaos/adapters.py) on synthetic histories, and the workload's adapter lines."""

from __future__ import annotations

import random
from dataclasses import replace

from tests.chaos.adapters import ADAPTERS, name_adapters
from tests.chaos.history import History, InputFile, InputLine, check
from tests.chaos.synthetic_histories import clean_history
from tests.chaos.workload import SIZES, plan_workload

TONE_A, TONE_B = ADAPTERS[:2]


def adapter_history(answers: dict[str, tuple[str, str]]) -> History:
    """The clean history with lines a and b naming adapters: custom_id -> (named, (answered model, text))."""
    history = clean_history()
    named = {"a": TONE_A, "b": TONE_A}
    source = history.inputs["file-1"]
    lines = tuple(replace(line, model=named.get(line.custom_id, "chaos-model")) for line in source.lines)
    history.inputs["file-1"] = InputFile(source.file_id, source.tenant, lines)
    record = history.batches["batch_1"]
    for line in record.output_lines:
        model, text = answers[line["custom_id"]]
        body = line["response"]["body"]
        body["model"] = model
        body["choices"][0]["message"]["content"] = text
    history.adapters, history.adapter_answers_alike = ADAPTERS, True
    return history


def adapter_findings(history: History) -> list[str]:
    return [f.detail for f in check(history).findings if f.kind == "adapter"]


def test_answers_under_the_adapters_their_lines_named_pass() -> None:
    history = adapter_history({"a": (TONE_A, "alpha beta"), "b": (TONE_A, "alpha beta gamma")})
    assert check(history).ok


def test_a_line_answered_under_another_adapter_is_flagged() -> None:
    history = adapter_history({"a": (TONE_A, "alpha"), "b": (TONE_B, "alpha")})
    assert adapter_findings(history) == [f"b named {TONE_A} but was answered as {TONE_B}"]


def test_on_the_fake_an_adapter_answer_with_other_words_is_flagged_as_a_wrong_resume() -> None:
    history = adapter_history({"a": (TONE_A, "alpha beta"), "b": (TONE_A, "alpha delta gamma")})
    assert len(adapter_findings(history)) == 1 and "is not its words" in adapter_findings(history)[0]
    history.adapter_answers_alike = False  # the real engine: answers depend on the prompt
    assert check(history).ok


def test_the_workload_names_the_base_and_every_adapter_and_keeps_the_seeds_lines() -> None:
    plan = plan_workload(random.Random("workload/3"), model="chaos-model", size=SIZES["small"])
    named = name_adapters(plan, random.Random("adapters/3"), base="chaos-model")
    models = [body["model"] for batch in named for body in batch.bodies]
    assert set(models) == {"chaos-model", *ADAPTERS}
    assert [line.model for batch in named for line in batch.lines] == models
    strip = [({**b, "model": "chaos-model"}, replace(line, model=None)) for p in named for b, line in
             zip(p.bodies, p.lines, strict=True)]  # fmt: skip
    assert strip == [(b, line) for p in plan for b, line in zip(p.bodies, p.lines, strict=True)]
    assert all(isinstance(line, InputLine) for batch in named for line in batch.lines)


def test_the_chaos_adapters_answer_with_different_first_words_on_the_fake() -> None:
    from worker.engine.fake import _WORDS, _start

    firsts = {_start(f"adapter:{name}", 0, None) % len(_WORDS) for name in ADAPTERS}
    assert len(firsts) == len(ADAPTERS)
