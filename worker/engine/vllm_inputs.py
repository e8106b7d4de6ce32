"""The vLLM adapter's inputs: a neutral `Generation` as vLLM's engine inputs (rendered prompts) and SamplingParams.

A mixin of `VllmEngine` (worker/engine/vllm_engine.py), kept apart so each concern of the adapter has its own
module: chat rendering (the direct path for plain text turns, vLLM's renderer for everything else), completion
prompts, embeddings' pooling params, and sampling. Nothing here imports vLLM at module level.
"""

from __future__ import annotations

from typing import Any

from worker.engine import EngineRequest
from worker.engine.generation import IMAGE_PART, Generation, output_budget
from worker.engine.vllm_ahead import Ahead
from worker.engine.vllm_chat import Conversation, DirectChat
from worker.engine.vllm_parsers import Parsers
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
    _parsers: Parsers | None

    def _check_kind(self, generation: Generation, url: str) -> None:
        wanted = generation.kind if generation.pooling else "generate"
        if wanted not in self._tasks:
            raise BodyError(f"model {self.model_name!r} does not serve {url}", code="unsupported_endpoint", param="url")

    def _check_media(self, generation: Generation) -> None:
        """Images need a vision-language model: refused before anything is fetched on a text-only one."""
        if generation.parts(IMAGE_PART) and not getattr(self._model_config, "is_multimodal_model", False):
            raise BodyError(
                f"model {self.model_name!r} does not take images (it is a text-only model)",
                code="images_not_supported",
                param=generation.where,
            )

    def _chat_params(self, *, continue_final: bool = False, extra: dict[str, Any] | None = None) -> Any:
        from vllm.renderers import ChatParams

        # What LLM.chat() passes for a plain Hugging Face tokenizer; `continue_final` answers by continuing
        # a final assistant turn (a Messages prefill) instead of starting a new one; `extra`: the tools and
        # thinking switch (vllm_parsers.py).
        kwargs: dict[str, Any] = {"add_generation_prompt": not continue_final, "continue_final_message": continue_final}
        kwargs |= {"tools": None, "tokenize": False, **(extra or {})}
        return ChatParams(chat_template=None, chat_template_content_format="auto", chat_template_kwargs=kwargs)

    def _prepare(self, rid: str, generation: Generation) -> list[tuple[str, Any, Any]]:
        """(engine id, rendered prompt, params) for each engine request this generation becomes."""
        if generation.pooling:
            from vllm import PoolingParams

            if generation.kind == "embed":
                params = PoolingParams(task="embed", dimensions=self._dimensions(generation.dimensions))
            else:
                params = PoolingParams(task="classify")
            if generation.messages:  # an input with images: one user turn, as the model's chat template renders it
                return [(f"{rid}#0", self._render_classified(generation), params)]
            return [(f"{rid}#{i}", self._render_plain(item), params) for i, item in enumerate(generation.inputs)]
        if generation.kind == "chat":
            if self._parsers is not None:
                self._parsers.check(generation)
            turns = None if generation.continue_final else generation.plain_turns()
            prompt = (self._direct and turns is not None and self._direct.render(turns)) or self._render_chat(
                generation
            )
        else:
            assert generation.prompt is not None
            prompt = self._render_plain(generation.prompt)
            self._check_grammar_applies(generation, prompt["prompt_token_ids"])
        return [(rid, prompt, self._sampling_params(generation, len(prompt["prompt_token_ids"])))]

    def _check_grammar_applies(self, generation: Generation, prompt_ids: list[int]) -> None:
        """A raw prompt held to a schema on a model that thinks first: vLLM would start the grammar only once the
        model closed its thinking, and the text would hold the thinking before the JSON. Refused, naming why."""
        constraint = generation.constraint
        if constraint is not None and self._parsers is not None and self._parsers.thinking_open(prompt_ids):
            raise BodyError(
                f"{constraint.param}: model {self.model_name!r} thinks before it answers (its registry entry names a "
                "reasoning_parser) and this prompt does not close a thinking block, so its answer cannot be held "
                "to the format: send it as a chat, or end the prompt with the model's end-of-thinking marker",
                code="unsupported_parameter",
                param=constraint.param,
            )

    def _dimensions(self, asked: int | None) -> int | None:
        """The embedding size to ask vLLM for: `asked` on a Matryoshka model (vLLM checks its range); on any
        other, OpenAI's answer for ada-002 naming the served model (its own size asked for is no change)."""
        size = getattr(self._model_config, "embedding_size", None)
        if asked is not None and self._model_config.is_matryoshka and size and not 1 <= asked <= size:
            raise BodyError(
                f"Model {self.model_name!r} only supports dimensions in range [1, {size}], got {asked}.",
                code="invalid_value",
                param="dimensions",
            )
        if asked is None or self._model_config.is_matryoshka:
            return asked
        if asked == size:
            return None
        raise BodyError(
            f"This model does not support specifying dimensions: {self.model_name!r} returns {size}-dimension "
            "embeddings (only Matryoshka models can be shortened); leave 'dimensions' out.",
            code="unsupported_parameter",
            param="dimensions",
        )

    def _render_chat(self, generation: Generation) -> Any:
        # The template writes BOS itself, so the tokenizer adds no special tokens (as in LLM.chat()).
        extra = self._parsers.template_kwargs(generation) if self._parsers is not None else None
        params = self._chat_params(continue_final=generation.continue_final, extra=extra)
        _, (prompt,) = self._renderer.render_chat([list(generation.messages)], params)
        return prompt

    def _render_classified(self, generation: Generation) -> Any:
        """A classifier's input with images: its user turn through vLLM's chat renderer and multimodal processor (the
        template's turn as written, no answer prompt after it)."""
        params = self._chat_params(extra={"add_generation_prompt": False})
        _, (prompt,) = self._renderer.render_chat([list(generation.messages)], params)
        return prompt

    def _render(self, conversation: Conversation) -> Any:
        _, (prompt,) = self._renderer.render_chat([conversation], self._chat_params())
        return prompt

    def _render_ahead(self, request: EngineRequest, direct: DirectChat) -> Ahead | None:
        """What `add` builds of a chat request whose answer starts a new turn (no prefill) and whose messages are
        plain text (as the direct path renders them), built on another thread with that thread's `direct`."""
        parsed = parse(request.url, request.body, seed=request.seed)
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
        # (a Messages max_tokens: `model_context_window_exceeded`).
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
                StructuredOutputsParams(json=grammar_schema(constraint.json_schema))
                if constraint.json_schema is not None
                else StructuredOutputsParams(json_object=True)
            )
        if self._parsers is not None:  # tools and thinking: a forced call's schema, the budget (vllm_parsers.py)
            values |= self._parsers.sampling(generation, grammar=grammar_schema)
        return SamplingParams(**values)


# The `format`s guidance (llguidance) enforces; others are annotations, as JSON Schema itself treats `format`
# (2019-09 on), and are left out of the grammar rather than failing the line (a validator ignores them too).
GRAMMAR_FORMATS = frozenset(
    {"date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uri", "uuid"}
)
# Keywords whose value is a schema, a list of schemas, or a map of names to schemas: where `format` may sit.
_SCHEMA_VALUED = ("additionalProperties", "items", "not", "if", "then", "else", "contains", "propertyNames")
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def grammar_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` as the grammar compiler gets it: without the `format` annotations it does not enforce (a copy;
    the schema itself when it has none). Iterative: a line nests at most 64 levels, so this is bounded."""
    found: list[dict[str, Any]] = []
    stack: list[Any] = [schema]
    while stack:
        node = stack.pop()
        if not isinstance(node, dict):
            continue
        if isinstance(node.get("format"), str) and node["format"] not in GRAMMAR_FORMATS:
            found.append(node)
        stack.extend(node.get(key) for key in _SCHEMA_VALUED)
        stack.extend(child for key in _SCHEMA_LISTS if isinstance(node.get(key), list) for child in node[key])
        stack.extend(child for key in _SCHEMA_MAPS if isinstance(node.get(key), dict) for child in node[key].values())
    if not found:
        return schema
    copied: dict[str, Any] = _without_formats(schema, {id(node) for node in found})
    return copied


def _without_formats(node: Any, drop: set[int]) -> Any:
    """A copy of `node` with `format` removed from the schema objects in `drop` (ids)."""
    if isinstance(node, list):
        return [_without_formats(item, drop) for item in node]
    if not isinstance(node, dict):
        return node
    copied = {key: _without_formats(value, drop) for key, value in node.items()}
    if id(node) in drop:
        copied.pop("format", None)
    return copied
