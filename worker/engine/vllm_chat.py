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
vLLM's. The text is encoded by the tokenizer's Rust backend directly where it has one (`backend_tokenizer`):
Hugging Face's `encode` wraps each text in a batch of one (`encode_batch`), which hands it to the tokenizers
library's thread pool and waits; beside a CPU engine whose threads hold every core that hand-over cost
~0.13 ms a request against ~0.02 ms on the calling thread (bench/engine_profile.py). The probe checks that
encoder like the rest, and falls back to the tokenizer's own `encode` if it differs. Nothing here imports vLLM.
"""

from __future__ import annotations

import functools
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


Encoder = Callable[[str], list[int]]  # a text to token ids, no special tokens added


class DirectChat:
    """Renders plain-text chat conversations with `tokenizer`, as `render(conversation)` (the renderer) would."""

    def __init__(self, tokenizer: Any, *, max_model_len: int, encode: Encoder | None = None) -> None:
        self._tokenizer = tokenizer
        self._max_model_len = max_model_len
        self._encode = encode or functools.partial(tokenizer.encode, add_special_tokens=False)

    @classmethod
    def probe(
        cls, tokenizer: Any, *, max_model_len: int, render: Callable[[Conversation], dict[str, Any]]
    ) -> DirectChat | None:
        """This model's direct path if it matches the renderer on every probe conversation, else None; with the
        tokenizer's Rust backend as its encoder if that matches too."""
        for encode in (backend_encoder(tokenizer), None):
            direct = cls(tokenizer, max_model_len=max_model_len, encode=encode)
            try:
                if all(_same(render(c), direct.render(c)) for c in _PROBES):
                    return direct
            except Exception:  # a template that wants more than plain turns: the renderer handles it
                logger.info("direct chat rendering failed on a probe", exc_info=True)
        logger.info("direct chat rendering differs from vLLM's renderer here: kept the renderer")
        return None

    def render(self, conversation: Conversation) -> dict[str, Any] | None:
        """The engine input for `conversation`, or None where the renderer must decide (roles, length)."""
        if any(turn["role"] not in _ROLES for turn in conversation):
            return None
        text = self._tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
        if not isinstance(text, str):
            return None
        token_ids = self._encode(text)  # the template writes BOS itself
        if len(token_ids) > self._max_model_len - _MARGIN:
            return None
        return {"type": "token", "prompt_token_ids": list(token_ids), "prompt": text, "arrival_time": time.time()}


def backend_encoder(tokenizer: Any) -> Encoder | None:
    """The Rust tokenizer's own `encode` on the calling thread (no special tokens), if `tokenizer` has one."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not callable(getattr(backend, "encode", None)):
        return None

    def encode(text: str) -> list[int]:
        return list(backend.encode(text, add_special_tokens=False).ids)

    return encode


def _same(expected: dict[str, Any], got: dict[str, Any] | None) -> bool:
    """Two engine inputs alike but for their arrival time (the one field that differs by when it was built)."""
    return got is not None and _comparable(expected) == _comparable(got)


def _comparable(engine_input: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in engine_input.items() if key != "arrival_time"}
