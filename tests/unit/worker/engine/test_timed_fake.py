"""The GPU-timed fake: each step lasts the roofline time of its batch on the target, slots refill at once."""

from __future__ import annotations

import json
import time

import pytest

from storage.planning.roofline import HARDWARE_PRESETS, LLAMA_70B_FP8, Hardware, ModelShape, row
from storage.registry import ModelSpec
from worker.engine import Engine, EngineRequest
from worker.engine.timed_fake import PATH, TimedFakeEngine, from_spec

H100 = HARDWARE_PRESETS["8xH100-SXM"]
# A node 100x slower than an 8x H100 keeps the steps long enough (tens of ms) to time on a busy CI machine.
SLOW = Hardware(8, 80e9, 3.35e10, H100.usd_per_gpu_hour)


def chat(request_id: str, max_tokens: int) -> EngineRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens}
    return EngineRequest(request_id, "/v1/chat/completions", body)


def test_the_step_time_is_the_planners_tpot_for_70b_fp8_on_8xh100() -> None:
    engine: Engine = TimedFakeEngine()
    assert isinstance(engine, TimedFakeEngine) and engine.max_num_seqs == 384
    for batch, tpot_ms in ((384, 21.87), (32, 4.24)):
        assert engine.step_time(batch) == pytest.approx(row(LLAMA_70B_FP8, H100, 4096, batch).tpot_ms / 1e3)
        assert engine.step_time(batch) * 1e3 == pytest.approx(tpot_ms, abs=0.01)
    assert engine.step_time(0) == 0.0


def test_a_step_lasts_the_roofline_time_of_the_batch_that_ran() -> None:
    engine = TimedFakeEngine(hardware=SLOW, max_num_seqs=8)
    for i in range(3):
        engine.add(chat(f"r{i}", max_tokens=4))
    engine.step()  # settles the wake-up lead
    started = time.perf_counter()
    engine.step()
    finished = time.perf_counter()
    step = engine.timeline[-1]
    assert step.batch == 3 and step.roofline_seconds == pytest.approx(engine.step_time(3))
    # The step waited out its roofline time and recorded its own clocks inside the call. How much longer a
    # loaded machine kept the thread away is not the engine's to promise (bench/gpu_timed.py measures that).
    assert started <= step.started < step.ended <= finished
    assert step.ended - step.started >= engine.step_time(3) * 0.98


def test_a_finished_slot_is_refilled_at_the_next_step() -> None:
    engine = TimedFakeEngine(hardware=SLOW, max_num_seqs=2)
    engine.add(chat("short", max_tokens=1))
    engine.add(chat("long", max_tokens=3))
    engine.add(chat("next", max_tokens=1))
    assert [r.request_id for r in engine.step()] == ["short"]
    assert (engine.timeline[-1].batch, engine.timeline[-1].waiting) == (2, 1)
    assert [r.request_id for r in engine.step()] == ["next"]  # took the freed slot on the very next step
    assert engine.timeline[-1].batch == 2
    finished = engine.step()
    assert [r.request_id for r in finished] == ["long"] and finished[0].completion_tokens == 3
    assert not engine.has_unfinished()


def test_sleeping_out_the_step_costs_almost_no_cpu() -> None:
    engine = TimedFakeEngine(hardware=SLOW, max_num_seqs=16)
    for i in range(16):
        engine.add(chat(f"r{i}", max_tokens=5))
    cpu, wall = time.process_time(), time.perf_counter()
    while engine.has_unfinished():
        engine.step()
    assert time.process_time() - cpu < 0.25 * (time.perf_counter() - wall)


def test_the_registry_selects_it_by_path_with_the_entry_hardware_and_batch() -> None:
    spec = ModelSpec.model_validate(
        json.loads(json.dumps({"path": PATH, "max_num_seqs": 32, "hardware": "8xH200", "extra": {"context": 2048}}))
    )
    engine = from_spec("llama-70b-timed", spec)
    assert (engine.model_name, engine.max_num_seqs, engine.context) == ("llama-70b-timed", 32, 2048)
    assert engine.step_time(32) == pytest.approx(row(LLAMA_70B_FP8, HARDWARE_PRESETS["8xH200"], 2048, 32).tpot_ms / 1e3)
    custom = from_spec("m", ModelSpec(path=PATH, extra={"weights_gb": 8.0, "kv_bytes_per_token": 131072}))
    assert custom.shape == ModelShape(weight_bytes=8e9, kv_bytes_per_token=131072)
    assert custom.max_num_batched_tokens == 16384  # vLLM's default on an H100
    assert from_spec("m", ModelSpec(path=PATH, max_num_batched_tokens=2048)).max_num_batched_tokens == 2048
    with pytest.raises(ValueError, match="hardware must be one of"):
        from_spec("m", ModelSpec(path=PATH, hardware="1xRTX"))


def test_the_worker_loads_it_for_a_registry_entry_with_its_path(monkeypatch: pytest.MonkeyPatch) -> None:
    from storage.settings import Settings
    from worker.engine.factory import load_engine

    monkeypatch.setenv("BACKFILL_MODELS", json.dumps({"llama-70b-timed": {"path": PATH, "max_num_seqs": 384}}))
    engine = load_engine(Settings(), "llama-70b-timed")
    assert isinstance(engine, TimedFakeEngine) and engine.max_num_seqs == 384
    assert engine.step_time(384) == pytest.approx(0.02187, abs=1e-5)


def prompt(request_id: str, tokens: int, max_tokens: int) -> EngineRequest:
    """A chat request whose prompt counts `tokens` (the fake counts words, plus 2 per message)."""
    body = {"model": "m", "messages": [{"role": "user", "content": " ".join(["w"] * (tokens - 2))}]}
    return EngineRequest(request_id, "/v1/chat/completions", {**body, "max_tokens": max_tokens})


def test_a_long_prompt_is_prefilled_in_chunks_while_the_others_keep_decoding() -> None:
    engine = TimedFakeEngine(max_num_seqs=4, max_num_batched_tokens=1000, timed=False)
    engine.add(prompt("decoder", 10, max_tokens=4))
    engine.step()  # its prompt, and its first token
    engine.add(prompt("long", 2500, max_tokens=2))
    engine.step(), engine.step()
    assert [(s.prefill_tokens, s.tokens) for s in list(engine.timeline)[1:]] == [(999, 1), (999, 1)]
    finished = engine.step()  # the last 502 prompt tokens: its first token; the decoder its fourth and last
    assert [r.request_id for r in finished] == ["decoder"]
    assert (engine.timeline[-1].prefill_tokens, engine.timeline[-1].tokens) == (502, 2)
    assert [r.request_id for r in engine.step()] == ["long"]
    # The chunks attend to the earlier chunks' KV cache: the third read 1,998 tokens of it.
    assert engine.timeline[3].roofline_seconds == pytest.approx(engine.step_time(1, 502, 1998))


def test_a_full_prefill_step_takes_the_compute_time_of_its_tokens() -> None:
    engine = TimedFakeEngine(timed=False)
    for i in range(40):
        engine.add(prompt(f"r{i}", 500, max_tokens=1))
    finished = engine.step()
    step = engine.timeline[-1]
    assert step.prefill_tokens == 16384 and len(finished) == 32  # 32 whole prompts and most of the 33rd
    assert step.roofline_seconds == pytest.approx(16384 / 56_062, rel=1e-3)


def test_each_request_reports_its_ttft_and_tpot() -> None:
    engine = TimedFakeEngine(max_num_seqs=2, timed=False)
    engine.add(prompt("a", 500, max_tokens=4))
    engine.add(prompt("b", 500, max_tokens=1))
    engine.add(prompt("c", 500, max_tokens=2))  # waits for b's slot
    while engine.has_unfinished():
        engine.step()
    timing = {t.request_id: t for t in engine.requests}
    steps = [s.roofline_seconds for s in engine.timeline]
    first = steps[0]
    assert timing["a"].ttft == pytest.approx(first) and timing["b"].ttft == pytest.approx(first)
    assert timing["b"].tpot is None and timing["a"].output_tokens == 4
    assert timing["c"].ttft == pytest.approx(first + steps[1])
    assert len(steps) == 4 and timing["a"].tpot == pytest.approx(sum(steps[1:]) / 3)


def test_a_cached_prefix_is_not_prefilled_again() -> None:
    engine = TimedFakeEngine(timed=False)
    system = {"role": "system", "content": " ".join(["s"] * 998)}
    for i in range(2):
        body = {"model": "m", "messages": [system, {"role": "user", "content": f"q{i}"}], "max_tokens": 1}
        engine.add(EngineRequest(f"r{i}", "/v1/chat/completions", body))
        engine.step()
    assert [s.prefill_tokens for s in engine.timeline] == [1003, 3]


@pytest.mark.parametrize(
    ("prompt_tokens", "outputs", "requests", "within"),
    # Prompt-bound jobs: the steady state is the whole job. Output-bound: identical requests run in waves
    # of 384, which the estimate's staggered drain (half a batch on average) overstates by ~3%.
    [(500, 5, 3000, 0.01), (2000, 10, 1000, 0.01), (500, 1, 2000, 0.01), (8, 100, 3840, 0.05)],
)
def test_the_planners_job_estimate_matches_the_engine_fed_ideally(
    prompt_tokens: int, outputs: int, requests: int, within: float
) -> None:
    from storage.planning.step_time import estimate_job

    engine = TimedFakeEngine(timed=False)
    for i in range(requests):
        engine.add(prompt(f"r{i}", prompt_tokens, max_tokens=outputs))
    while engine.has_unfinished():
        engine.step()
    estimate = estimate_job(
        LLAMA_70B_FP8,
        H100,
        4096,
        requests=requests,
        prompt_tokens=prompt_tokens,
        output_tokens=outputs,
        max_num_seqs=384,
    )
    assert engine.clock == pytest.approx(estimate.seconds, rel=within)
