"""The vLLM adapter's inputs: a neutral `Generation` as vLLM's engine inputs (rendered prompts) and SamplingParams.

A mixin of `VllmEngine` (worker/engine/vllm_engine.py), kept apart so each concern of the adapter has its own
module: chat rendering (the direct path for plain text turns, vLLM's renderer for everything else), completion
prompts, embeddings' pooling params, and sampling. Nothing here imports vLLM at module level.
"""

from __future__ import annotations

from typing import Any

from worker.engine import EngineRequest
from worker.engine.generation import Generation, output_budget
from worker.engine.vllm_ahead import Ahead
from worker.engine.vllm_chat import Conversation, DirectChat
from worker.engine.vllm_resume import exact_params
from worker.engine.wire import parse
from worker.engine.wire.base import BodyError


class VllmInputs:
    """Builds vLLM inputs for `VllmEngine`; reads the engine's model facts from the attributes it sets."""

    model_name: str
    _tasks: set[str]
    _renderer: Any
    _model_config: Any
    _max_model_len: int
    _defaults: dict[str, Any]
    _direct: DirectChat | None

    def _check_kind(self, generation: Generation, url: str) -> None:
        wanted = "embed" if generation.kind == "embed" else "generate"
        if wanted not in self._tasks:
            raise BodyError(f"model {self.model_name!r} does not serve {url}", code="unsupported_endpoint", param="url")

    def _chat_params(self, *, continue_final: bool = False) -> Any:
        from vllm.renderers import ChatParams

        # What LLM.chat() passes for a plain Hugging Face tokenizer; `continue_final` answers by continuing
        # a final assistant turn (Anthropic's prefill) instead of starting a new one.
        kwargs: dict[str, Any] = {"add_generation_prompt": not continue_final, "continue_final_message": continue_final}
        kwargs |= {"tools": None, "tokenize": False}
        return ChatParams(chat_template=None, chat_template_content_format="auto", chat_template_kwargs=kwargs)

    def _prepare(self, rid: str, generation: Generation) -> list[tuple[str, Any, Any]]:
        """(engine id, rendered prompt, params) for each engine request this generation becomes."""
        if generation.kind == "embed":
            from vllm import PoolingParams

            params = PoolingParams(task="embed", dimensions=generation.dimensions)
            return [(f"{rid}#{i}", self._render_plain(item), params) for i, item in enumerate(generation.inputs)]
        if generation.kind == "chat":
            turns = None if generation.continue_final else generation.plain_turns()
            prompt = (self._direct and turns is not None and self._direct.render(turns)) or self._render_chat(
                generation
            )
        else:
            assert generation.prompt is not None
            prompt = self._render_plain(generation.prompt)
        return [(rid, prompt, self._sampling_params(generation, len(prompt["prompt_token_ids"])))]

    def _render_chat(self, generation: Generation) -> Any:
        # The template writes BOS itself, so the tokenizer adds no special tokens (as in LLM.chat()).
        params = self._chat_params(continue_final=generation.continue_final)
        _, (prompt,) = self._renderer.render_chat([list(generation.messages)], params)
        return prompt

    def _render(self, conversation: Conversation) -> Any:
        _, (prompt,) = self._renderer.render_chat([conversation], self._chat_params())
        return prompt

    def _render_ahead(self, request: EngineRequest, direct: DirectChat) -> Ahead | None:
        """What `add` builds of a chat request whose answer starts a new turn (no prefill) and whose messages are
        plain text (as the direct path renders them), built on another thread with that thread's `direct`."""
        parsed = parse(request.url, request.body)
        generation = parsed.generation
        turns = generation.plain_turns() if generation.kind == "chat" and not generation.continue_final else None
        if turns is None or (prompt := direct.render(turns)) is None:
            return None
        params = self._sampling_params(generation, len(prompt["prompt_token_ids"]))
        exact = generation.restart_reason() is None and exact_params(params)
        return Ahead(parsed, [(request.request_id, prompt, params)], exact=exact)

    def _render_plain(self, item: str | list[int]) -> Any:
        from vllm.renderers.inputs.preprocess import parse_model_prompt

        raw = {"prompt": item} if isinstance(item, str) else {"prompt_token_ids": list(item)}
        (prompt,) = self._renderer.render_cmpl([parse_model_prompt(self._model_config, raw)])
        return prompt

    def _sampling_params(self, generation: Generation, prompt_tokens: int) -> Any:
        from vllm.sampling_params import RequestOutputKind, SamplingParams, StructuredOutputsParams

        # No cap asked: the generation config's default, else the rest of the context (as vLLM's server); a cap
        # beyond the context is refused with OpenAI's 400, or stops at the context when the limit clamps
        # (Anthropic's max_tokens: `model_context_window_exceeded`).
        default = self._defaults.get("max_tokens")
        limit = output_budget(
            generation, prompt_tokens=prompt_tokens, max_model_len=self._max_model_len, default=default
        )
        sampling = generation.sampling
        values: dict[str, Any] = {
            **{k: v for k, v in self._defaults.items() if k != "max_tokens"},
            "n": sampling.n,
            "max_tokens": limit,
            "min_tokens": sampling.min_tokens,
            "stop": list(sampling.stop),
            "ignore_eos": sampling.ignore_eos,
            "logprobs": sampling.logprobs,
            "output_kind": RequestOutputKind.FINAL_ONLY,
            "skip_clone": True,  # built per request: vLLM need not deep-copy it at add_request (as its server)
        }
        for name in ("temperature", "top_p", "seed", "presence_penalty", "frequency_penalty"):
            if (value := getattr(sampling, name)) is not None:
                values[name] = value
        if sampling.top_k:  # 0 or None: off
            values["top_k"] = sampling.top_k
        if sampling.logit_bias:
            values["logit_bias"] = dict(sampling.logit_bias)
        if (constraint := generation.constraint) is not None:
            values["structured_outputs"] = (
                StructuredOutputsParams(json=constraint.json_schema)
                if constraint.json_schema is not None
                else StructuredOutputsParams(json_object=True)
            )
        return SamplingParams(**values)
