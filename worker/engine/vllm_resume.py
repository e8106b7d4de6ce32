"""Resuming a vLLM generation from its checkpoint, and stitching the two parts into one answer.

The engine submits the original prompt's token ids followed by the ids generated before the hand-back as
the new prompt, with `max_tokens` (and `min_tokens`) reduced by what is done. The answer must read as one
uninterrupted generation: its text is the detokenised *whole* generated sequence (a token pair across the
boundary decodes as it would have, unlike two texts glued together), usage counts the original prompt once
and every generated token as completion, and a stop string that spans the boundary still stops: vLLM only
searches the text it generates after the resume, so the engine checks the stitched text itself while a
match could still begin in the earlier part (`boundary_stop`, after each step) and when the request ends
(`stitch`). Nothing here imports vLLM: it works on vLLM's outputs and the tokenizer it is handed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Decode = Callable[[list[int]], str]


@dataclass
class Resume:
    """A request continued from its checkpoint."""

    token_ids: list[int]  # generated before the hand-back
    prompt_tokens: int  # the original prompt's length: usage counts it once
    old_text: str  # those ids decoded, where a stop string spanning the boundary would begin
    stops: list[str]
    include_stop: bool
    window_open: bool  # a stop string could still begin in the earlier text: check after every step
    decode: Decode  # generated ids -> text, as vLLM's detokenizer would produce it after the original prompt


@dataclass
class Stitched:
    """One choice of the resumed request, shaped like vLLM's CompletionOutput for `choice_of`/`message_of`."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None
    stop_reason: int | str | None
    logprobs: None = None


def stream_decoder(tokenizer: Any, prompt_ids: list[int]) -> Decode:
    """Decode generated ids exactly as vLLM's fast incremental detokenizer does after `prompt_ids`.

    A token-by-token `DecodeStream` primed with the prompt: byte-fallback tokens that do not yet form a
    character yield nothing (a plain `decode` would give U+FFFD for them), and the first token's leading
    space depends on the prompt. Other tokenizers fall back to `decode` of the ids.
    """
    backend = getattr(tokenizer, "_tokenizer", None)
    try:
        from tokenizers import Tokenizer
        from tokenizers.decoders import DecodeStream
    except ImportError:  # pragma: no cover - vLLM depends on tokenizers
        backend = None
    if backend is None or not isinstance(backend, Tokenizer):
        return lambda ids: str(tokenizer.decode(ids, skip_special_tokens=True))

    def decode(ids: list[int]) -> str:
        stream = DecodeStream(ids=list(prompt_ids), skip_special_tokens=True)
        return "".join(stream.step(backend, token) or "" for token in ids)

    return decode


def exact_params(params: Any) -> bool:
    """True if these SamplingParams continue identically from a token prefix (see wire/resume.py)."""
    return bool(
        params.n == 1
        and not params.presence_penalty
        and not params.frequency_penalty
        and params.repetition_penalty == 1.0
        and params.seed is None
        and params.logprobs is None
        and params.prompt_logprobs is None
        and params.structured_outputs is None
    )


def resumed_params(params: Any, done: int) -> Any:
    """A copy of `params` for the rest of the generation: `done` tokens fewer to go."""
    rest = params.clone()
    if rest.max_tokens is not None:
        rest.max_tokens = max(1, rest.max_tokens - done)
    rest.min_tokens = max(0, rest.min_tokens - done)
    return rest


def new_resume(token_ids: list[int], *, prompt_tokens: int, params: Any, decode: Decode) -> Resume:
    """The state kept for a resumed request (its earlier text decoded once); `decode` as in `Resume`."""
    stops = list(params.stop or [])
    old_text = decode(token_ids) if stops else ""
    return Resume(
        token_ids=token_ids,
        prompt_tokens=prompt_tokens,
        old_text=old_text,
        stops=stops,
        include_stop=bool(params.include_stop_str_in_output),
        window_open=bool(stops and old_text),
        decode=decode,
    )


def continue_from(
    prepared: tuple[str, Any, Any], earlier: list[int], tokenizer: Any
) -> tuple[list[tuple[str, Any, Any]], Resume]:
    """The prompt followed by the tokens generated before, as the prompt of the rest of the generation."""
    engine_id, prompt, params = prepared
    if params.max_tokens is not None:
        earlier = earlier[: params.max_tokens - 1]  # at least one token is left to generate
    original = list(prompt["prompt_token_ids"])
    continued = {key: value for key, value in prompt.items() if key != "prompt"}
    continued["prompt_token_ids"] = original + earlier
    decode = stream_decoder(tokenizer, original)
    resume = new_resume(earlier, prompt_tokens=len(original), params=params, decode=decode)
    return [(engine_id, continued, resumed_params(params, len(earlier)))], resume


def _spanning_match(resume: Resume, text: str) -> tuple[int, str] | None:
    """The first stop string (in the order given, as vLLM checks them) found in `text` beyond the part
    the earlier run already searched: its position and the string."""
    for stop in resume.stops:
        at = text.find(stop, max(0, len(resume.old_text) - len(stop) + 1))
        if at >= 0:
            return at, stop
    return None


def _cut(resume: Resume, text: str, match: tuple[int, str]) -> str:
    at, stop = match
    return text[: at + len(stop)] if resume.include_stop else text[:at]


def boundary_stop(resume: Resume, new_ids: list[int]) -> bool:
    """After a step: True if a stop string that begins in the earlier text just completed (the request ends).

    Closes the window once the new text is long enough that no match can begin in the earlier part.
    """
    if not new_ids:
        return False
    text = resume.decode(resume.token_ids + new_ids)
    match = _spanning_match(resume, text)
    if match is not None and match[0] < len(resume.old_text):
        return True
    if len(text) - len(resume.old_text) >= max(len(stop) for stop in resume.stops):
        resume.window_open = False
    return False


@dataclass
class EndedHere:
    """vLLM's RequestOutput for a resumed request the adapter ended itself (`boundary_stop`): the new ids;
    `stitch` finds the stop string and cuts the text."""

    new_ids: list[int]
    prompt_token_ids: tuple[int, ...] = ()
    num_cached_tokens: int = 0
    error: None = None

    @property
    def outputs(self) -> list[Stitched]:
        return [Stitched(0, "", self.new_ids, None, None)]


def stitch(resume: Resume, completion: Any) -> Stitched:
    """vLLM's output for the rest of the generation joined to the earlier part, as one generation."""
    ids = resume.token_ids + list(completion.token_ids)
    text = resume.decode(ids)
    finish, reason = completion.finish_reason, completion.stop_reason
    if resume.stops and (match := _spanning_match(resume, text)) is not None:
        text, finish, reason = _cut(resume, text, match), "stop", match[1]
    return Stitched(completion.index, text, ids, None if finish is None else str(finish), reason)
