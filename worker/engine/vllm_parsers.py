"""vLLM's own parsers on the adapter's requests: tools and thinking into the chat template, a forced or strict
tool choice and a thinking budget into the sampling params, and reasoning and tool calls out of the answer.

The registry entry names vLLM's parsers for the model (`tool_parser`, e.g. "hermes"; `reasoning_parser`, e.g.
"deepseek_r1"); the reasoning parser also goes to the engine (`EngineArgs.reasoning_parser`), which needs it for
`thinking_token_budget` (at the budget vLLM closes the thinking and the answer follows) and to start a structured
output's grammar only after the thinking. The chat template renders the tools and switches thinking on and off
(`enable_thinking`, `reasoning_effort`, as vLLM's server passes them).

A forced tool choice is a JSON schema (worker/engine/tools.py) whatever the model's own call format; `strict`
tools under tool_choice `auto` are held to their schemas with a structural tag (the grammar applies from the
model's call marker on) where this module knows the parser's call envelope (`_ENVELOPES`); other parsers' calls
under `auto` are read as the model wrote them. Only this module and the other vllm*.py modules import vLLM.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

from storage.registry import ModelSpec
from worker.engine.generation import Generated, Generation, ToolCall
from worker.engine.tools import check_capabilities, forced_calls, forced_schema, normalized_arguments, random_ids

# tool parser -> (call start marker, the text before the arguments with "{name}", after them, call end marker).
_ENVELOPES = {"hermes": ("<tool_call>", '{{"name": "{name}", "arguments": ', "}", "</tool_call>")}
_ANY: dict[str, Any] = {"type": "object"}
Schemas = Callable[[dict[str, Any]], dict[str, Any]]


def engine_kwargs(spec: ModelSpec, extra: dict[str, Any]) -> dict[str, Any]:
    """EngineArgs beyond the named fields: `extra` (spec.engine_extra()) and the reasoning parser (thinking
    budgets, and structured outputs whose grammar starts after the thinking). vLLM hands the reasoning parser on
    to the structured-outputs config, which must then be its config object, not a JSON object."""
    kwargs = dict(extra)
    if spec.reasoning_parser:
        from vllm.config import StructuredOutputsConfig

        kwargs.setdefault("reasoning_parser", spec.reasoning_parser)
        if isinstance(found := kwargs.get("structured_outputs_config"), dict):
            kwargs["structured_outputs_config"] = StructuredOutputsConfig(**found)
    return kwargs


class Parsers:
    """One model's reasoning and tool-call parsers (either may be absent), built once at engine start."""

    def __init__(self, spec: ModelSpec, tokenizer: Any, *, model_name: str, max_model_len: int) -> None:
        from vllm.reasoning import ReasoningParserManager
        from vllm.tool_parsers import ToolParserManager

        self.model_name, self.max_model_len = model_name, max_model_len
        self._tokenizer = tokenizer
        self._tool_name = spec.tool_parser
        self._backend = str((spec.engine_extra().get("structured_outputs_config") or {}).get("backend", "auto"))
        try:
            self._tool_cls = ToolParserManager.get_tool_parser(spec.tool_parser) if spec.tool_parser else None
        except KeyError:
            known = ", ".join(sorted(ToolParserManager.list_registered()))
            raise ValueError(
                f"model {model_name!r}: tool_parser {spec.tool_parser!r} is not one of vLLM's: {known}"
            ) from None
        try:
            reasoning_cls = (
                ReasoningParserManager.get_reasoning_parser(spec.reasoning_parser) if spec.reasoning_parser else None
            )
        except KeyError:
            known = ", ".join(sorted(ReasoningParserManager.list_registered()))
            raise ValueError(
                f"model {model_name!r}: reasoning_parser {spec.reasoning_parser!r} is not one of vLLM's: {known}"
            ) from None
        # A parser checks at construction that the tokenizer has its markers (`<think>` ...) as single tokens.
        self._reasoning = reasoning_cls(tokenizer) if reasoning_cls is not None else None

    # -- in: the template, the sampling params ----------------------------------------------------------

    def check(self, generation: Generation) -> None:
        """Refuse what this model cannot do (BodyError): thinking, tool_choice auto without its parsers."""
        check_capabilities(
            generation,
            model=self.model_name,
            tool_parser=self._tool_cls is not None,
            reasoning_parser=self._reasoning is not None,
            max_model_len=self.max_model_len,
        )

    def thinking_open(self, prompt_ids: list[int]) -> bool:
        """Whether vLLM holds a grammar back until the model closes its thinking: the model has a reasoning parser
        and the prompt leaves a thinking block open, or opens none (the parser's `is_reasoning_end`, as vLLM's
        structured-output manager asks it)."""
        return self._reasoning is not None and not self._reasoning.is_reasoning_end(prompt_ids)

    def template_kwargs(self, generation: Generation) -> dict[str, Any]:
        """The chat template's tools and thinking switch for this generation."""
        kwargs: dict[str, Any] = {}
        if generation.tools:
            kwargs["tools"] = [tool.template_form() for tool in generation.tools]
        if (reasoning := generation.reasoning) is not None:
            kwargs["enable_thinking"] = reasoning.enabled
            if reasoning.effort is not None:
                kwargs["reasoning_effort"] = reasoning.effort
        return kwargs

    def sampling(self, generation: Generation, *, grammar: Schemas = lambda schema: schema) -> dict[str, Any]:
        """SamplingParams fields for tools and thinking: a forced choice's schema or strict tools' grammar
        (replacing a response format, as vLLM's server does for forced calls), the thinking budget, and the
        call and thinking markers kept in the text for the parsers. `grammar`: a schema as the structured-outputs
        backend is to get it (vllm_inputs.grammar_schema)."""
        from vllm.sampling_params import StructuredOutputsParams

        values: dict[str, Any] = {}
        if (schema := forced_schema(generation)) is not None:
            values["structured_outputs"] = StructuredOutputsParams(json=grammar(schema))
        elif generation.constraint is None and (strict := self._strict_calls(generation, grammar)) is not None:
            values["structured_outputs"] = strict
        reasoning = generation.reasoning
        if reasoning is not None and reasoning.enabled and reasoning.budget_tokens is not None:
            values["thinking_token_budget"] = reasoning.budget_tokens
        if (generation.tools and generation.tool_choice.mode != "none") or (
            reasoning is not None and reasoning.enabled
        ):
            values["skip_special_tokens"] = False  # a model whose markers are special tokens keeps them in the text
        return values

    def _strict_calls(self, generation: Generation, grammar: Schemas) -> Any:
        """Strict tools under tool_choice auto: free text, then calls whose arguments are held to their tool's
        schema (a tool that is not strict takes any object), for a parser whose call envelope is known. With
        guidance, a Lark grammar over the call markers' token ids; with xgrammar, vLLM's legacy structural tag
        (guidance compiles that one without its schemas). None: not enforced."""
        from vllm.sampling_params import StructuredOutputsParams

        envelope = _ENVELOPES.get(self._tool_name or "")
        if generation.tool_choice.mode != "auto" or not any(tool.strict for tool in generation.tools) or not envelope:
            return None
        start, before, after, end = envelope
        schemas = [(tool.name, grammar(tool.parameters) if tool.strict else _ANY) for tool in generation.tools]
        if self._backend == "xgrammar":
            structures = [
                {"begin": start + before.format(name=name), "schema": schema, "end": after + end}
                for name, schema in schemas
            ]
            tag = {"type": "structural_tag", "structures": structures, "triggers": [start]}
            return StructuredOutputsParams(structural_tag=json.dumps(tag))
        ids = [self._single_token(start), self._single_token(end)]
        if self._backend != "guidance" or None in ids:
            return None
        rules = [f"start: free call{'*' if generation.tool_choice.parallel else '?'}", f"free: <[^{ids[0]}]>*"]
        rules.append("call: " + " | ".join(f"call{index}" for index in range(len(schemas))))
        for index, (name, schema) in enumerate(schemas):
            head = json.dumps(before.format(name=name))
            rules.append(f"call{index}: <[{ids[0]}]> {head} args{index} {json.dumps(after)} <[{ids[1]}]>")
            rules.append(f"args{index}: %json " + json.dumps({"x-guidance": {"whitespace_flexible": False}, **schema}))
        return StructuredOutputsParams(grammar="\n".join(rules) + "\n")

    def _single_token(self, text: str) -> int | None:
        ids = self._tokenizer.encode(text, add_special_tokens=False)
        return int(ids[0]) if len(ids) == 1 else None

    # -- out: reasoning and tool calls -----------------------------------------------------------------

    def finish(
        self, generation: Generation, generated: Generated, *, prompt_ids: list[int], token_ids: list[int]
    ) -> None:
        """Take the thinking and the tool calls out of a generated sequence's text (in place)."""
        if generation.kind != "chat":
            return
        request = self._request(generation)
        if self._thinks(generation, prompt_ids, token_ids):
            self._split_reasoning(generated, token_ids, request)
        if generation.tools and generation.tool_choice.forced:
            calls = forced_calls(generated.text.strip(), generation, random_ids())
            if calls is not None:
                generated.text, generated.tool_calls = "", calls
        elif generation.tools and generation.tool_choice.mode == "auto" and self._tool_cls is not None:
            self._auto_calls(generated, request)
        if generated.tool_calls and generated.finish_reason == "stop":
            generated.finish_reason = "tool_calls"

    def _thinks(self, generation: Generation, prompt_ids: list[int], token_ids: list[int]) -> bool:
        """Whether the answer starts with thinking: asked for, or (the model's default) a thinking block left open
        by the prompt or opened by the answer."""
        parser = self._reasoning
        if parser is None:
            return False
        if generation.reasoning is not None:
            return generation.reasoning.enabled
        start, end = getattr(parser, "start_token_id", None), getattr(parser, "end_token_id", None)
        if start is None:
            return False
        for token in reversed(prompt_ids):
            if token in (start, end):
                return bool(token == start)
        return start in token_ids[:1]

    def _request(self, generation: Generation) -> Any:
        """vLLM's request object, as its parsers take it (the tools, tool_choice auto)."""
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        tools = [tool.template_form() for tool in generation.tools] or None
        return ChatCompletionRequest(
            model=self.model_name, messages=[], tools=tools, tool_choice="auto" if tools else "none"
        )

    def _split_reasoning(self, generated: Generated, token_ids: list[int], request: Any) -> None:
        assert self._reasoning is not None
        reasoning, content = self._reasoning.extract_reasoning(generated.text, request)
        generated.reasoning, generated.text = reasoning or "", (content or "").lstrip("\n")
        end = getattr(self._reasoning, "end_token_id", None)
        if end is not None:
            generated.reasoning_tokens = token_ids.index(end) + 1 if end in token_ids else len(token_ids)
        else:
            encoded = self._tokenizer.encode(generated.reasoning, add_special_tokens=False)
            generated.reasoning_tokens = min(len(encoded), generated.token_count)

    def _auto_calls(self, generated: Generated, request: Any) -> None:
        assert self._tool_cls is not None
        try:
            found = self._tool_cls(self._tokenizer, request.tools).extract_tool_calls(generated.text, request)
        except Exception:  # a parser that trips on noise: the text stays an answer, as vLLM's server keeps it
            return
        if not found.tools_called:
            return
        ids: Iterator[str] = random_ids()
        generated.tool_calls = [
            ToolCall(next(ids), call.function.name, normalized_arguments(call.function.arguments))
            for call in found.tool_calls
        ]
        generated.text = (found.content or "").strip()
