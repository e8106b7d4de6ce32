"""Requests rendered ahead, on the claimer's thread, so that the engine's thread only submits them.

Rendering a chat request (its template, the tokenizer, its `SamplingParams`) took ~0.2 ms of the engine thread's
time per engine step (docs/benchmarks.md, stop 31): on a GPU node that is time the GPU waits between steps. The
runner's claimer thread now renders the rows of each claim before handing them over (`Engine.prepare`), with a
`DirectChat` on a tokenizer of its own (a deep copy, probed like the engine's): the engine thread's tokenizer is
never shared with another thread, so Hugging Face's "Already borrowed" cannot arise. Chat requests (Responses
too) and Messages requests without a prefill are rendered ahead; what is not (completions, embeddings, a
prefill, a resumed request, a body that fails, a prompt near the context length) is rendered by `add` on the
engine's thread as before, and its errors reported from there. Nothing here imports vLLM.

The claimer renders a claim's rows in one burst, holding the GIL, and an engine thread back from the GPU (which
waits with the GIL released) would wait for it up to Python's switch interval (5 ms): `prepare` offers the GIL
back after each render (`time.sleep(0)`). On a GPU-shaped engine thread (bench/render_ahead.py: 10 ms GPU
waits, 1 ms of the thread's own work, one 400-word chat request replaced per step, claims of 192) the thread's
time beyond the GPU wait grew 2.6 ms a step when it rendered itself, 0.58 ms with the claimer rendering in
bursts (p99 7.4 ms), 0.16 ms with the claimer yielding (p99 3.1 ms).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from worker.engine import EngineRequest
from worker.engine.vllm_chat import DirectChat

logger = logging.getLogger(__name__)

Prepared = list[tuple[str, Any, Any]]  # (engine request id, engine input, sampling params) per engine request


@dataclass
class Ahead:
    """One request rendered ahead: what `add` would have built from its body."""

    parsed: Any  # the line as its wire module read it (worker/engine/wire.Parsed)
    prepared: Prepared
    exact: bool  # a resume from its tokens gives what running on would


Build = Callable[[EngineRequest, DirectChat], Ahead | None]


class AheadRenders:
    """Renders requests on one other thread (`prepare`) and hands them to the engine's thread (`take`).

    The engine thread takes a claim's rows in the order they were prepared, so a render still held when a later
    one is taken belongs to a row that did not reach `add` (claimed back while still in the engine): it is
    dropped then. At most `capacity` renders are held (oldest dropped first). A row whose render was dropped is
    rendered by `add` if it comes back.
    """

    def __init__(self, direct: DirectChat, build: Build, *, capacity: int) -> None:
        self._direct, self._build, self._capacity = direct, build, capacity
        self._ready: OrderedDict[str, tuple[int, Ahead]] = OrderedDict()  # request id -> (its order, its render)
        self._prepared = 0
        self._lock = threading.Lock()

    def prepare(self, requests: Collection[EngineRequest]) -> None:
        """Render what can be rendered ahead; called from one thread at a time (the runner's claimer)."""
        for request in requests:
            if request.resume_token_ids:
                continue
            try:
                ahead = self._build(request, self._direct)
            except Exception:  # `add` renders it again and reports what is wrong with it, on the engine's thread
                logger.debug("request %s left for the engine thread to render", request.request_id, exc_info=True)
                continue
            finally:
                time.sleep(0)  # the GIL offered back after each render (above)
            if ahead is None:
                continue
            with self._lock:
                self._prepared += 1
                self._ready.pop(request.request_id, None)  # a row rendered again goes to the end, in order
                self._ready[request.request_id] = (self._prepared, ahead)
                while len(self._ready) > self._capacity:
                    self._ready.popitem(last=False)

    def take(self, request_id: str) -> Ahead | None:
        """The render of `request_id`, once (None: not rendered ahead); it arrives now, as `add` would have it."""
        with self._lock:
            order, ahead = self._ready.pop(request_id, (0, None))
            while self._ready and next(iter(self._ready.values()))[0] < order:  # passed over: never to be taken
                self._ready.popitem(last=False)
        if ahead is not None:
            for _, prompt, _ in ahead.prepared:
                prompt["arrival_time"] = time.time()
        return ahead

    def __len__(self) -> int:
        with self._lock:
            return len(self._ready)
