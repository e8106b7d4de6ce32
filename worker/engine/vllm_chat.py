"""Chat prompts for the vLLM adapter, rendered directly: the model's chat template and tokenizer, called once each.

vLLM's renderer (`render_chat`) parses the messages, resolves the template's content format and kwargs,
renders, tokenizes through Hugging Face's `__call__`, checks lengths and builds the engine input, all on the
engine's thread, where a CPU engine's cores and a GPU both wait for it. A `ChatBody`'s conversation is plain
text turns (`conversation()`), and for those the same prompt is the template rendered with
`add_generation_prompt` and its text encoded without special tokens, as `LLM.chat()` does: `add()` went from
0.37-0.41 to 0.28 ms per request on the demo model (bench/engine_profile.py, vLLM's own `add_request` ~0.1 ms
of it). `DirectChat.probe` checks it at start on a few conversations against the
renderer (text, token ids and the engine input's fields); on any difference the adapter keeps the renderer.
A prompt near the context length goes through the renderer too, so its length checks and error messages stay
vLLM's. Nothing here imports vLLM.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

Conversation = list[dict[str, str]]
_ROLES = frozenset({"system", "user", "assistant"})  # turns every chat template renders as given
_MARGIN = 8  # tokens short of the context below which no length check of the renderer can differ
_PROBES: list[Conversation] = [
    [{"role": "user", "content": "Write a Function that adds two numbers."}],
    [
        {"role": "system", "content": "You are terse.\n Answer in ONE line."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4."},
        {"role": "user", "content": "  And 3 x 3 ?  \u00e9\u4e2d"},
    ],
]


class DirectChat:
    """Renders plain-text chat conversations with `tokenizer`, as `render(conversation)` (the renderer) would."""

    def __init__(self, tokenizer: Any, *, max_model_len: int) -> None:
        self._tokenizer = tokenizer
        self._max_model_len = max_model_len

    @classmethod
    def probe(
        cls, tokenizer: Any, *, max_model_len: int, render: Callable[[Conversation], dict[str, Any]]
    ) -> DirectChat | None:
        """This model's direct path if it matches the renderer on every probe conversation, else None."""
        direct = cls(tokenizer, max_model_len=max_model_len)
        try:
            for conversation in _PROBES:
                expected, got = render(conversation), direct.render(conversation)
                if got is None or _comparable(expected) != _comparable(got):
                    logger.info("direct chat rendering differs from vLLM's renderer here: kept the renderer")
                    return None
        except Exception:  # a template that wants more than plain turns: the renderer handles it
            logger.info("direct chat rendering failed on a probe: kept vLLM's renderer", exc_info=True)
            return None
        return direct

    def render(self, conversation: Conversation) -> dict[str, Any] | None:
        """The engine input for `conversation`, or None where the renderer must decide (roles, length)."""
        if any(turn["role"] not in _ROLES for turn in conversation):
            return None
        text = self._tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
        if not isinstance(text, str):
            return None
        token_ids = self._tokenizer.encode(text, add_special_tokens=False)  # the template writes BOS itself
        if len(token_ids) > self._max_model_len - _MARGIN:
            return None
        return {"type": "token", "prompt_token_ids": list(token_ids), "prompt": text, "arrival_time": time.time()}


def _comparable(engine_input: dict[str, Any]) -> dict[str, Any]:
    """An engine input without its arrival time (the one field that differs by when it was built)."""
    return {key: value for key, value in engine_input.items() if key != "arrival_time"}
