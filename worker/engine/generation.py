"""What an engine runs and what it hands back, in no protocol's words: the seam between wire formats and engines.

A batch line's body is turned into a `Generation` by its protocol's wire module (worker/engine/wire/), and an
engine's `Output` into the line's answer by the same module; engines see only these two. A `Generation` says
what to compute: a chat (messages as chat templates take them: role and content, and later tool calls and
images), a text completion, or embeddings; how to sample; how long an answer may be; what shape it must have. An
`Output` says what was computed: each sequence's text, token ids, why it stopped and its logprobs, or the vectors,
and the token counts. Nothing here names a protocol or imports vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from worker.engine import EngineResult, error_result

Kind = Literal["chat", "text", "embed", "classify"]


class BodyError(Exception):
    """A body that cannot run: it becomes one error result, never an exception out of `add()`."""

    def __init__(self, message: str, *, code: str, param: str | None = None, status_code: int = 400) -> None:
        super().__init__(message)
        self.message, self.code, self.param, self.status_code = message, code, param, status_code

    def to_result(self, request_id: str) -> EngineResult:
        return error_result(request_id, self.status_code, self.message, code=self.code, param=self.param)


Message = dict[str, Any]  # {"role": ..., "content": str | list of parts}, as a Hugging Face chat template takes it

# A message's content parts, in OpenAI's shape as vLLM's chat renderer takes them: {"type": "text", "text": ...},
# an image {"type": "image_url", "image_url": {"url": a data: or http(s) URL, "detail": "auto" | "low" | "high"}},
# a document {"type": "document", "document": {"url": a data: or http(s) URL of a PDF, "title": ..., "context": ...}}.
# Before an engine renders them, worker/engine/media.py fetches and checks them off the engine's thread: each image
# becomes {"type": "image_pil", "image_pil": <a decoded PIL image>} and each document text parts.
IMAGE_PART, DOCUMENT_PART, DECODED_IMAGE_PART = "image_url", "document", "image_pil"
MEDIA_PARTS = frozenset({IMAGE_PART, DOCUMENT_PART})


@dataclass(frozen=True)
class OutputLimit:
    """How long an answer may be: what the body asked for, in which field, and what happens at the context's end."""

    requested: int | None = None  # None: not asked
    name: str = "max_tokens"  # the body's field that asked (error messages name it)
    clamp: bool = False  # stop at the context's end instead of refusing a cap the context cannot hold
    default: int | None = None  # when nothing was asked: this (16 for legacy completions), else the model's default


@dataclass(frozen=True)
class Sampling:
    """How to sample: vLLM's SamplingParams in neutral names (None: the model's default)."""

    n: int = 1
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None  # 0 or None: off
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[int, float] | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    stop: tuple[str, ...] = ()
    logprobs: int | None = None  # alternatives per token to report (0: the chosen token's own); None: no logprobs


@dataclass(frozen=True)
class Constraint:
    """The shape an answer must have (structured output): a JSON schema, or any JSON object."""

    json_schema: dict[str, Any] | None = None
    json_object: bool = False
    param: str = "response_format"  # the body's field that asked (a schema the engine cannot compile names it)


@dataclass(frozen=True)
class Tool:
    """A function the model may call: its name, what it does, and a JSON schema of its arguments."""

    name: str
    description: str | None = None
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})
    strict: bool = False  # the arguments must match `parameters` (enforced with structured outputs)

    def template_form(self) -> dict[str, Any]:
        """The tool as chat templates take it (`tools=` of `apply_chat_template`)."""
        function: dict[str, Any] = {"name": self.name, "parameters": self.parameters}
        if self.description:
            function["description"] = self.description
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class ToolChoice:
    """Whether the model may (`auto`), must not (`none`), must (`required`) call a tool, or must call `name`."""

    mode: Literal["auto", "none", "required", "named"] = "auto"
    name: str | None = None
    parallel: bool = True  # several calls in one answer

    @property
    def forced(self) -> bool:
        """The answer must be a call (`required` or a named tool): enforced with structured outputs."""
        return self.mode in ("required", "named")


@dataclass(frozen=True)
class Reasoning:
    """Thinking before answering, on a model that can: on or off, and a hard limit on its tokens."""

    enabled: bool = True
    budget_tokens: int | None = None  # at the budget the thinking is closed and the answer follows
    effort: str | None = None  # "minimal", "low", "medium", "high": what the request asked, for the template
    param: str = "reasoning_effort"  # the body's field that asked (error messages name it)
    budget_param: str = "thinking_token_budget"  # the body's field holding the budget
    # What the protocol answers when the model cannot think ("{model}": the served model's name).
    refusal: str = "Unsupported parameter: 'reasoning_effort' is not supported with this model."


@dataclass(frozen=True)
class Adapter:
    """The LoRA adapter a generation runs under (docs/adapters.md): its served name and PEFT folder (None: no longer
    registered, the line fails with `adapter_not_found`)."""

    name: str
    path: str | None


@dataclass(frozen=True)
class Generation:
    """One request for an engine, whatever protocol it came in: see the module docstring."""

    kind: Kind
    limit: OutputLimit = OutputLimit()
    sampling: Sampling = Sampling()
    messages: tuple[Message, ...] = ()  # chat
    continue_final: bool = False  # chat: the answer continues the final assistant message (a prefill)
    constraint: Constraint | None = None
    prompt: str | list[int] | None = None  # text: a string or token ids
    # embed and classify: one vector (or set of label scores) each; a classify input with images is instead one
    # user turn in `messages` (its parts: text and images), one set of label scores
    inputs: tuple[str | list[int], ...] = ()
    dimensions: int | None = None  # embed
    tools: tuple[Tool, ...] = ()  # chat: functions the model may call (the chat template renders them)
    tool_choice: ToolChoice = ToolChoice()
    reasoning: Reasoning | None = None  # chat: None is the model's default
    adapter: Adapter | None = None  # None: the base model

    @property
    def pooling(self) -> bool:
        """Embeddings or classification: one pass over each input, nothing generated."""
        return self.kind in ("embed", "classify")

    @property
    def where(self) -> str:
        """The body's field holding the prompt (a pooling model's inputs), for error messages."""
        return "input" if self.pooling else "messages" if self.kind == "chat" else "prompt"

    def plain_turns(self) -> list[dict[str, str]] | None:
        """The chat as role + text turns when every message is only that and nothing else goes to the template
        (no tools, no reasoning switch): the direct render path. Else None."""
        if self.tools or self.reasoning is not None:
            return None
        turns = []
        for message in self.messages:
            content = message.get("content")
            if set(message) != {"role", "content"} or not isinstance(content, str):
                return None
            turns.append({"role": str(message["role"]), "content": content})
        return turns

    def turn_texts(self) -> list[str]:
        """Each message's text (text parts joined): what a model-free engine counts tokens of."""
        texts = []
        for message in self.messages:
            content = message.get("content")
            if isinstance(content, list):
                content = "\n".join(str(part.get("text") or "") for part in content if isinstance(part, dict))
            texts.append(str(content or ""))
        return texts

    def parts(self, *types: str) -> list[dict[str, Any]]:
        """The content parts of these types, in order (every message's list content)."""
        return [
            part
            for message in self.messages
            if isinstance(content := message.get("content"), list)
            for part in content
            if isinstance(part, dict) and part.get("type") in types
        ]

    def needs_media(self) -> bool:
        """True while an image or a document is still a URL (worker/engine/media.py resolves it)."""
        return bool(self.parts(*MEDIA_PARTS))

    def restart_reason(self) -> str | None:
        """Why this generation cannot resume exactly from its generated token ids (it restarts from its prompt),
        or None if it can. Resuming submits the prompt and the tokens generated so far as the new prompt; the next
        token's distribution stays the same for greedy and unseeded sampling, but not with penalties over output
        tokens (resumed tokens count as prompt), a seeded generator's position, several choices in one request,
        logprobs (not kept with a checkpoint), structured output or a forced tool call (its grammar would restart),
        tool calls or thinking (parsed out of the whole answer; a thinking budget counts from the prompt)."""
        sampling = self.sampling
        if self.pooling:
            return "embeddings" if self.kind == "embed" else "classification"
        if self.parts(*MEDIA_PARTS, DECODED_IMAGE_PART):
            return "images"  # a resume is a prompt of token ids, without the images they were processed with
        if sampling.n > 1:
            return "n > 1"
        if sampling.presence_penalty or sampling.frequency_penalty:
            return "presence or frequency penalty"
        if sampling.seed is not None:
            return "seeded sampling"
        if sampling.logprobs is not None:
            return "logprobs"
        if self.constraint is not None or self.tool_choice.forced or any(tool.strict for tool in self.tools):
            return "structured output"
        if self.tools and self.tool_choice.mode != "none":
            return "tool calls"  # parsed out of the whole answer, from the original prompt on
        if self.reasoning is not None and self.reasoning.enabled:
            return "reasoning"  # its budget counts from the prompt's open thinking block
        return None


@dataclass
class TokenLogprob:
    """One generated token's logprob and the alternatives ranked best first (the chosen one among them)."""

    token: str
    logprob: float
    top: list[tuple[str, float]]


@dataclass
class ToolCall:
    """A call of one of the request's tools that the model's answer holds: its id, the tool, its arguments."""

    id: str
    name: str
    arguments: str  # JSON text


@dataclass
class Generated:
    """One generated sequence: its answer text (reasoning and tool calls taken out of it) and what else it holds."""

    text: str
    token_count: int
    finish_reason: str  # "stop" (end of sequence or a stop string), "length", or "tool_calls"
    matched: str | int | None = None  # the stop string (or token id) that ended it, if one did
    logprobs: list[TokenLogprob] | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    reasoning: str | None = None  # the thinking before the answer, on a reasoning model
    reasoning_tokens: int = 0  # of token_count


@dataclass
class Output:
    """What an engine computed for one request; `error` set instead when it failed (an error line)."""

    request_id: str
    response_id: str = ""  # the answer's id (engines that must be deterministic derive it from the request)
    sequences: list[Generated] = field(default_factory=list)
    vectors: list[list[float]] = field(default_factory=list)
    scores: list[dict[str, float]] = field(default_factory=list)  # classify: each input's label probabilities
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens served from the engine's prefix cache
    engine_seconds: float = 0.0
    checkpoint: list[int] = field(default_factory=list)  # the generated ids, when a resume from them is exact
    error: EngineResult | None = None
    # Why the answer was cut short before its own stop ("expiry": its batch's window closed, docs/workflow.md);
    # None for an answer that ended by itself. A cut answer reads as a length stop in every protocol.
    cut_by: str | None = None

    @classmethod
    def failed(cls, error: EngineResult) -> Output:
        return cls(request_id=error.request_id, error=error)


def output_budget(generation: Generation, *, prompt_tokens: int, max_model_len: int, default: int | None = None) -> int:
    """The output cap to run with: what the body asked for, else its default, else `default` (the model's), else
    the rest of the context. A prompt that leaves no room is a 400 (`context_length_exceeded`); a cap beyond the
    context too, as OpenAI and vLLM's server answer, unless the limit clamps (a Messages max_tokens then stops
    at the context's end, `model_context_window_exceeded`)."""
    limit = generation.limit
    room = max_model_len - prompt_tokens
    if room < 1:
        raise BodyError(
            f"This model's maximum context length is {max_model_len} tokens, "
            f"but the prompt has {prompt_tokens} tokens, leaving no room for output.",
            code="context_length_exceeded",
            param=generation.where,
        )
    if limit.clamp:
        return min(limit.requested or room, room)
    if limit.requested is not None and limit.requested > room:
        raise context_length_error(generation, max_model_len=max_model_len, prompt_tokens=prompt_tokens)
    if limit.requested is not None:
        return limit.requested
    return min(limit.default or default or room, room)


def context_length_error(generation: Generation, *, max_model_len: int, prompt_tokens: int | None) -> BodyError:
    """OpenAI's 400 for a prompt plus an output cap longer than the model's context (prompt None: not counted)."""
    limit, name = generation.limit.requested or 0, generation.limit.name
    chat = generation.kind == "chat"
    where = "in the messages" if chat else "in your prompt"
    asked = (
        f"{prompt_tokens + limit} tokens ({prompt_tokens} {where}, {limit} in the completion)"
        if prompt_tokens is not None
        else f"{limit} tokens in the completion alone"
    )
    return BodyError(
        f"This model's maximum context length is {max_model_len} tokens. However, you requested {asked}. "
        f"Please reduce the length of the {'messages' if chat else 'prompt'} or completion.",
        code="context_length_exceeded",
        param=name,
    )
