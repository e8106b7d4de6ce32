"""The real vLLM adapter on the tiny demo model and on MiniLM: OpenAI shapes, batching, refusals, aborts."""

from __future__ import annotations

import base64
import json
import math
import struct
from typing import Any

import pytest
from openai.types import Completion, CreateEmbeddingResponse
from openai.types.chat import ChatCompletion
from openai.types.responses import Response

from worker.engine import EngineRequest, EngineResult
from worker.engine.vllm_engine import VllmEngine

pytestmark = pytest.mark.vllm

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
EMBEDDINGS = "/v1/embeddings"


def chat(request_id: str, max_tokens: int = 4, **extra: Any) -> EngineRequest:
    messages = [{"role": "user", "content": f"Say something about {request_id}."}]
    body = {"model": "backfill-demo", "messages": messages, "max_tokens": max_tokens, "ignore_eos": True, **extra}
    return EngineRequest(request_id, CHAT, body)


def run_all(engine: VllmEngine, requests: list[EngineRequest]) -> tuple[dict[str, EngineResult], dict[str, int]]:
    """Add everything, step until idle; each result and the step it came back on (0: refused by add)."""
    results: dict[str, EngineResult] = {}
    finished_at: dict[str, int] = {}
    for request in requests:
        if (refused := engine.add(request)) is not None:
            results[request.request_id], finished_at[request.request_id] = refused, 0
    step = 0
    while engine.has_unfinished():
        step += 1
        assert step < 3000, "the engine never finished"
        for result in engine.step():
            results[result.request_id], finished_at[result.request_id] = result, step
    return results, finished_at


def test_chat_completion_comes_back_in_openai_shape_with_real_token_counts(vllm_chat_engine: VllmEngine) -> None:
    results, _ = run_all(vllm_chat_engine, [chat("c1", max_tokens=6, n=2, logprobs=True, top_logprobs=2)])
    result = results["c1"]
    assert result.status_code == 200, result.body
    body = ChatCompletion.model_validate(result.body)
    assert body.id.startswith("chatcmpl-") and body.object == "chat.completion" and body.model == "backfill-demo"
    assert [c.index for c in body.choices] == [0, 1]
    assert all(c.finish_reason == "length" and c.message.role == "assistant" for c in body.choices)
    logprobs = body.choices[0].logprobs
    assert logprobs and logprobs.content and len(logprobs.content) == 6
    assert all(len(token.top_logprobs) == 2 for token in logprobs.content)
    assert body.usage and body.usage.completion_tokens == 12 == result.completion_tokens
    assert body.usage.prompt_tokens == result.prompt_tokens > 5
    assert body.usage.total_tokens == result.prompt_tokens + 12
    assert result.engine_seconds > 0


def test_completion_takes_text_or_token_ids_and_defaults_to_16_tokens(vllm_chat_engine: VllmEngine) -> None:
    text = EngineRequest("p1", COMPLETIONS, {"model": "m", "prompt": "import os\n", "ignore_eos": True})
    tokens = EngineRequest("p2", COMPLETIONS, {"model": "m", "prompt": [1, 50, 60], "max_tokens": 3, "logprobs": 1})
    results, _ = run_all(vllm_chat_engine, [text, tokens])
    first = Completion.model_validate(results["p1"].body)
    assert first.id.startswith("cmpl-") and first.object == "text_completion"
    assert first.usage and first.usage.completion_tokens == 16 and first.choices[0].finish_reason == "length"
    second = Completion.model_validate(results["p2"].body)
    assert second.usage and second.usage.prompt_tokens == 3 == results["p2"].prompt_tokens
    logprobs = second.choices[0].logprobs
    assert logprobs and logprobs.tokens and len(logprobs.tokens) == len(logprobs.token_logprobs or []) <= 3


def test_a_seed_makes_a_sampled_answer_repeatable(vllm_chat_engine: VllmEngine) -> None:
    same = {"temperature": 1.0, "seed": 7, "max_tokens": 12}
    results, _ = run_all(vllm_chat_engine, [chat("s", **same), EngineRequest("t", CHAT, chat("s", **same).body)])
    texts = {ChatCompletion.model_validate(r.body).choices[0].message.content for r in results.values()}
    assert len(texts) == 1


def test_a_long_answer_does_not_hold_back_short_ones(vllm_chat_engine: VllmEngine) -> None:
    requests = [chat("long", max_tokens=200), *(chat(f"short{i}", max_tokens=4) for i in range(6))]
    results, finished_at = run_all(vllm_chat_engine, requests)
    assert all(r.ok for r in results.values())
    assert results["long"].completion_tokens == 200
    shorts = [finished_at[f"short{i}"] for i in range(6)]
    assert max(shorts) < 20 < 200 <= finished_at["long"]
    assert max(results[f"short{i}"].engine_seconds for i in range(6)) < results["long"].engine_seconds


def test_bad_requests_fail_alone_while_the_others_complete(vllm_chat_engine: VllmEngine) -> None:
    bad = {
        "tools": chat("tools", tools=[{"type": "function", "function": {"name": "f"}}]),
        "stream": chat("stream", stream=True),
        "unknown": chat("unknown", frobnicate=1),
        "bad_type": chat("bad_type", temperature="hot"),
        "too_many_choices": chat("too_many_choices", n=1000),
        "too_long": chat("too_long", messages=[{"role": "user", "content": "alpha beta " * 1500}]),
        "prompt_list": EngineRequest("prompt_list", COMPLETIONS, {"model": "m", "prompt": ["a", "b"]}),
        "bad_token": EngineRequest("bad_token", COMPLETIONS, {"model": "m", "prompt": [1, 10**6]}),
        "embeddings": EngineRequest("embeddings", EMBEDDINGS, {"model": "m", "input": "hi"}),
    }
    good = [chat("good1", max_tokens=8), chat("good2", max_tokens=3)]
    results, finished_at = run_all(vllm_chat_engine, [good[0], *bad.values(), good[1]])
    assert results["good1"].ok and results["good2"].ok
    codes = {rid: results[rid].error_code for rid in bad}
    assert all(results[rid].status_code == 400 and finished_at[rid] == 0 for rid in bad), codes
    assert codes["tools"] == codes["stream"] == codes["unknown"] == "unsupported_parameter"
    assert codes["too_long"] == "context_length_exceeded"
    assert codes["embeddings"] == "unsupported_endpoint"
    assert results["unknown"].body["error"]["param"] == "frobnicate"


def test_abort_drops_requests_at_once_and_frees_their_slots(vllm_chat_engine: VllmEngine) -> None:
    engine = vllm_chat_engine
    for rid in ("a1", "a2"):
        assert engine.add(chat(rid, max_tokens=500)) is None
    produced = [engine.step() for _ in range(3)]
    assert engine.stats().running == 2 and not any(produced)
    engine.abort(["a1", "not-in-flight"])
    assert engine.stats().running == 1 and engine.has_unfinished()
    engine.abort(["a2"])
    assert not engine.has_unfinished() and engine.stats().running == 0
    assert engine.step() == []
    results, _ = run_all(engine, [chat("after", max_tokens=2)])
    assert list(results) == ["after"] and results["after"].ok


def test_stats_count_running_and_waiting_sequences(vllm_chat_engine: VllmEngine) -> None:
    engine = vllm_chat_engine
    for i in range(10):
        assert engine.add(chat(f"q{i}", max_tokens=8)) is None
    before = engine.stats()
    assert (before.running, before.waiting) == (0, 10)
    engine.step()
    seen = [engine.stats()]
    assert (seen[0].running, seen[0].waiting) == (engine.max_num_seqs, 10 - engine.max_num_seqs)
    while engine.has_unfinished():
        engine.step()
        seen.append(engine.stats())
    assert all(s.running <= engine.max_num_seqs for s in seen)
    assert (seen[-1].running, seen[-1].waiting) == (0, 0)


def test_embeddings_come_back_as_floats_or_base64_in_openai_shape(vllm_embed_engine: VllmEngine) -> None:
    texts = ["a cat sat on the mat", "a kitten sat on the rug", "quarterly tax filing deadline"]
    as_float = EngineRequest("f", EMBEDDINGS, {"model": "minilm", "input": texts})
    as_b64 = EngineRequest("b", EMBEDDINGS, {"model": "minilm", "input": texts, "encoding_format": "base64"})
    results, _ = run_all(vllm_embed_engine, [as_float, as_b64])
    floats = CreateEmbeddingResponse.model_validate(results["f"].body)
    assert floats.object == "list" and floats.model == "minilm" and [d.index for d in floats.data] == [0, 1, 2]
    vectors = [d.embedding for d in floats.data]
    assert all(len(v) == 384 and math.isclose(math.hypot(*v), 1.0, rel_tol=1e-2) for v in vectors)
    assert floats.usage.prompt_tokens == floats.usage.total_tokens == results["f"].prompt_tokens > 3
    decoded = [struct.unpack("<384f", base64.b64decode(d["embedding"])) for d in results["b"].body["data"]]
    assert all(
        math.isclose(x, y, abs_tol=1e-6)
        for got, want in zip(decoded, vectors, strict=True)
        for x, y in zip(got, want, strict=True)
    )
    cosine = [sum(x * y for x, y in zip(vectors[0], other, strict=True)) for other in vectors[1:]]
    assert cosine[0] > cosine[1] + 0.2  # a real model: cats are closer to kittens than to taxes


def test_embedding_engine_refuses_over_long_input_and_chat(vllm_embed_engine: VllmEngine) -> None:
    long_input = EngineRequest("long", EMBEDDINGS, {"model": "minilm", "input": "word " * 2000})
    results, _ = run_all(
        vllm_embed_engine, [long_input, chat("chat"), EngineRequest("ok", EMBEDDINGS, {"input": "hi"})]
    )
    assert results["long"].status_code == 400 and results["long"].error_code == "context_length_exceeded"
    assert results["chat"].error_code == "unsupported_endpoint"
    assert results["ok"].ok


RESPONSES = "/v1/responses"


def test_a_responses_request_runs_on_the_chat_path_and_parses_as_a_response(vllm_chat_engine: VllmEngine) -> None:
    body = {
        "model": "backfill-demo",
        "instructions": "Answer briefly.",
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "Name a color."}]}],
        "max_output_tokens": 6,
        "ignore_eos": True,
    }
    results, _ = run_all(vllm_chat_engine, [EngineRequest("r", RESPONSES, body)])
    result = results["r"]
    assert result.ok, result.body
    response = Response.model_validate(result.body)
    assert response.object == "response" and response.model == "backfill-demo" and response.status == "incomplete"
    assert response.output[0].type == "message" and response.output[0].content[0].type == "output_text"
    assert response.usage and response.usage.output_tokens == 6 == result.completion_tokens
    assert response.usage.input_tokens == result.prompt_tokens > 5  # the instructions were rendered in
    plain, _ = run_all(vllm_chat_engine, [EngineRequest("p", RESPONSES, {**body, "instructions": None})])
    assert plain["p"].prompt_tokens < result.prompt_tokens


def test_a_responses_json_schema_format_constrains_the_output(vllm_chat_engine: VllmEngine) -> None:
    schema = {
        "type": "object",
        "properties": {"color": {"type": "string", "enum": ["red", "blue"]}},
        "required": ["color"],
        "additionalProperties": False,
    }
    body = {
        "model": "backfill-demo",
        "input": "Pick a color.",
        "max_output_tokens": 64,
        "text": {"format": {"type": "json_schema", "name": "pick", "schema": schema, "strict": True}},
    }
    results, _ = run_all(vllm_chat_engine, [EngineRequest("j", RESPONSES, body)])
    response = Response.model_validate(results["j"].body)
    if response.status == "completed":  # random weights may pad with whitespace up to the cap
        assert json.loads(response.output_text)["color"] in {"red", "blue"}
    else:
        assert response.output_text.lstrip().startswith("{")


def test_an_output_cap_beyond_the_context_is_refused_before_it_runs_and_no_cap_fills_the_context(
    vllm_chat_engine: VllmEngine,
) -> None:
    ids = [100 + i % 100 for i in range(1000)]  # a 1000-token prompt in a 1024-token context: room for 24
    long = [{"role": "user", "content": "alpha beta gamma " * _repeats_leaving(vllm_chat_engine, room=40)}]
    requests = [
        chat("huge", max_tokens=10_000_000),
        EngineRequest("over", COMPLETIONS, {"model": "m", "prompt": ids, "max_tokens": 25}),
        EngineRequest("fits", COMPLETIONS, {"model": "m", "prompt": ids, "max_tokens": 24, "ignore_eos": True}),
        EngineRequest("resp", RESPONSES, {"model": "m", "input": "hello", "max_output_tokens": 4096}),
        chat("absent", messages=long),
    ]
    del requests[-1].body["max_tokens"]
    results, finished_at = run_all(vllm_chat_engine, requests)
    for rid, param in (("huge", "max_tokens"), ("over", "max_tokens"), ("resp", "max_output_tokens")):
        result = results[rid]
        assert (result.status_code, result.error_code, finished_at[rid]) == (400, "context_length_exceeded", 0), rid
        assert result.body["error"]["param"] == param and result.prompt_tokens == 0
        assert (result.error_message or "").startswith("This model's maximum context length is 1024 tokens.")
    assert "1025 tokens (1000 in your prompt, 25 in the completion)" in (results["over"].error_message or "")
    assert results["fits"].ok and results["fits"].completion_tokens == 24
    absent = results["absent"]  # no cap: vLLM's rest of the context
    assert absent.ok and absent.completion_tokens == 1024 - absent.prompt_tokens < 200


def _repeats_leaving(engine: VllmEngine, *, room: int) -> int:
    """How often to repeat "alpha beta gamma " in one chat message to leave about `room` tokens of context."""
    counts = []
    for repeats in (20, 40):
        rid = f"probe{repeats}"
        probe, _ = run_all(
            engine, [chat(rid, max_tokens=1, messages=[{"role": "user", "content": "alpha beta gamma " * repeats}])]
        )
        counts.append(probe[rid].prompt_tokens)
    per_repeat = (counts[1] - counts[0]) / 20
    return 40 + int((1024 - room - counts[1]) / per_repeat)


def test_a_repeated_prompt_reports_the_tokens_the_prefix_cache_served(vllm_chat_engine: VllmEngine) -> None:
    shared = [
        {"role": "system", "content": "You review Python code for a living. " * 20},
        {"role": "user", "content": "def f(): pass"},
    ]
    first, _ = run_all(vllm_chat_engine, [chat("first", max_tokens=2, messages=shared)])
    again, _ = run_all(vllm_chat_engine, [chat("again", max_tokens=2, messages=shared)])
    body = ChatCompletion.model_validate(again["again"].body)
    assert body.usage and body.usage.prompt_tokens_details
    cached = body.usage.prompt_tokens_details.cached_tokens
    assert cached == again["again"].cached_tokens and 0 < cached <= body.usage.prompt_tokens
    assert first["first"].cached_tokens < cached


def test_closing_one_engine_leaves_another_in_the_same_process_running(
    vllm_chat_engine: VllmEngine, demo_model_path: Any
) -> None:
    """vLLM's in-process shutdown tears down the process-wide parallel state; a second engine's close (a test's,
    or a model switch with two engines alive) must not take the first one's with it."""
    from storage.registry import ModelSpec

    other = VllmEngine("backfill-demo-2", ModelSpec(path=str(demo_model_path), max_num_seqs=2, max_model_len=256))
    results, _ = run_all(other, [chat("other")])
    assert results["other"].status_code == 200
    other.close()
    results, _ = run_all(vllm_chat_engine, [chat("after")])
    assert results["after"].status_code == 200 and results["after"].body["usage"]["completion_tokens"] == 4


def test_chat_prompts_rendered_directly_are_the_ones_vllms_renderer_gives(vllm_chat_engine: VllmEngine) -> None:
    """worker/engine/vllm_chat.py: the demo model's template takes the direct path, token for token the same."""
    direct = vllm_chat_engine._direct
    assert direct is not None
    conversations = [
        [{"role": "user", "content": "Write a function number 7 that adds two numbers."}],
        [{"role": "system", "content": " Be brief.\n\n"}, {"role": "user", "content": "<|eos|> and <|user|> typed in"}],
        [
            {"role": "user", "content": "Première question: 2+2 ?"},
            {"role": "assistant", "content": "4"},
            {"role": "user", "content": "中文 \t emoji 🎉"},
        ],
        [{"role": "user", "content": ""}],
    ]
    for conversation in conversations:
        got, expected = direct.render(conversation), vllm_chat_engine._render(conversation)
        assert got is not None
        assert {k: v for k, v in got.items() if k != "arrival_time"} == {
            k: v for k, v in expected.items() if k != "arrival_time"
        }
    assert direct.render([{"role": "tool", "content": "42"}]) is None  # the renderer decides other roles
    assert direct.render([{"role": "user", "content": "word " * 1100}]) is None  # and prompts near the context
