"""A deterministic Engine with no ML, for unit tests of the scheduler and the runner.

It keeps vLLM's continuous-batching contract: requests wait FIFO until one of `max_num_seqs` slots is
free, are admitted at the start of a step, decode one token per step, and leave the moment they finish,
so short requests overtake long ones. Bodies are validated and answered by the same code as the real
adapter (`worker.engine.wire`). One request holds one slot, whatever its `n`.

Images and documents go through the real media resolver (worker/engine/media.py: fetched, checked, decoded off
the engine's thread, failing the line as in the vLLM adapter); each image then counts FAKE_IMAGE_TOKENS prompt
tokens (OpenAI's price of a `detail: low` image) and a document's extracted text counts as text. A moderation input
with images (one user turn of text and image parts) is classified as one input: its scores hashed from its text and
its images' sizes.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import deque
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

from worker.engine import EngineRequest, EngineResult, EngineStats, Progress
from worker.engine.adapters import AdapterTally, load_without_model
from worker.engine.cuts import cut_answer
from worker.engine.decode_ledger import DecodeLedger
from worker.engine.fake_vectors import EMBEDDING_DIMENSIONS, scores_of, vector_of
from worker.engine.generation import DECODED_IMAGE_PART, Generated, Generation, Output, output_budget
from worker.engine.media_waits import MediaWaits
from worker.engine.tools import check_capabilities, derived_ids, forced_calls, forced_schema, sample_arguments
from worker.engine.wire import Parsed, parse
from worker.engine.wire.base import BodyError, server_error

_WORDS = ("lorem", "ipsum", "dolor", "sit", "amet", "consectetur", "adipiscing", "elit")
FAKE_IMAGE_TOKENS = 85  # prompt tokens per image, whatever its size
MEDIA_WAIT_SECONDS = 0.05


@dataclass
class _Sequence:
    request_id: str
    parsed: Parsed  # what runs (`parsed.generation`) and how its output is answered
    prompt_tokens: int
    tokens_to_decode: int
    added_at: float
    decoded: int = 0
    cached_tokens: int = 0
    token_ids: list[int] = field(default_factory=list)  # the first choice's, one per decoded token
    exact: bool = False  # resumable from its token ids (wire/resume.py)
    start: int = -1  # where its first choice starts in the word list (computed at its first token)
    resumed: int = 0  # tokens it continued from (a checkpoint): prompt to the engine, output to the user

    @property
    def generation(self) -> Generation:
        return self.parsed.generation

    def decode_one(self) -> None:
        """One more token: the fake's next id depends only on the request, its seed and the position."""
        if self.generation.pooling:
            self.decoded += 1
            return
        if self.start < 0:
            adapter = self.generation.adapter
            # Under an adapter the words follow the adapter alone: every line of one adapter answers alike.
            self.start = _start(
                self.request_id if adapter is None else f"adapter:{adapter.name}", 0, self.generation.sampling.seed
            )
        self.token_ids.append((self.start + self.decoded) % len(_WORDS))
        self.decoded += 1


class FakeEngine:
    """The Engine protocol with token counting instead of a model: one token per running request per step."""

    def __init__(
        self,
        model_name: str = "fake-model",
        *,
        max_num_seqs: int = 4,
        runner: str = "generate",
        task: str | None = None,
        max_model_len: int = 2048,
        fail_request_ids: Iterable[str] = (),
        step_seconds: float = 0.0,
        ledger: DecodeLedger | None = None,
        tool_parser: str | None = None,
        reasoning_parser: str | None = None,
        media: MediaWaits[tuple[str, Parsed]] | None = None,
    ) -> None:
        self.model_name = model_name
        # A model's parsers (registry `tool_parser`, `reasoning_parser`): only whether it has them matters here,
        # as it does to the vLLM adapter: thinking and tool_choice auto are refused without (worker/engine/tools.py).
        self.tool_parser, self.reasoning_parser = tool_parser, reasoning_parser
        self.ledger = ledger  # tests and benchmarks: what it decodes, in files a kill -9 keeps (decode_ledger.py)
        self.step_seconds = step_seconds  # pretend each step takes this long (end-to-end tests)
        self.max_num_seqs = max_num_seqs
        self.runner = runner
        # What a pooling model computes (the registry's `convert`): "embed" (8-dimension unit vectors, Matryoshka:
        # `dimensions` up to 8 keeps their head) or "classify" (the demo moderation model's labels, hashed scores).
        self.task = "generate" if runner == "generate" else task or "embed"
        self.max_model_len = max_model_len
        self.fail_request_ids = set(fail_request_ids)  # these finish with a 500, like an engine fault
        self.steps = 0
        self._waiting: deque[_Sequence] = deque()
        self._running: list[_Sequence] = []
        self._live: set[str] = set()  # ids waiting or running: the duplicate check stays O(1) at 768 in flight
        self._media: MediaWaits[tuple[str, Parsed]] = media if media is not None else MediaWaits()
        self._cached_prefixes: set[str] = set()  # a prefix cache stand-in: chat prefixes (all but the last message)
        self.adapters = AdapterTally()  # LoRA adapters: each line's decides its words (worker/engine/adapters.py)

    def add(self, request: EngineRequest) -> EngineResult | None:
        """Validate and queue a request; a body that cannot run comes back as an error result."""
        try:
            if request.request_id in self._live:
                raise BodyError(f"request {request.request_id!r} is already in flight", code="duplicate_request")
            parsed = load_without_model(parse(request.url, request.body, seed=request.seed), request, self.adapters)
            if parsed.generation.needs_media():  # checked, fetched and decoded off this thread; `step` queues it
                self._check_runner(parsed.generation, request.url)
                self._media.start(request.request_id, parsed.generation, (request.url, parsed))
                self._live.add(request.request_id)
                return None
            sequence = self._sequence(request.request_id, request.url, parsed)
            if request.resume_token_ids and sequence.exact:  # continue where the checkpoint left off
                resumed = list(request.resume_token_ids)[: sequence.tokens_to_decode - 1]
                sequence.token_ids, sequence.decoded, sequence.resumed = resumed, len(resumed), len(resumed)
            self._waiting.append(sequence)
            self.adapters.started(sequence.generation.adapter)
            self._live.add(request.request_id)
            if self.ledger is not None and not sequence.generation.pooling:
                self.ledger.begin(request.request_id, resumed=sequence.resumed, choices=sequence.generation.sampling.n)
        except BodyError as error:
            return error.to_result(request.request_id)
        return None

    def step(self) -> list[EngineResult]:
        """Admit waiting requests into free slots, decode one token each, return those that finished."""
        self.steps += 1
        landed = self._media_landed()
        if self.step_seconds:
            time.sleep(self.step_seconds)
        if not (self._waiting or self._running) and len(self._media):
            self._media.wait(MEDIA_WAIT_SECONDS)
            landed += self._media_landed()
        self._admit()
        return landed + self._decode()

    def _media_landed(self) -> list[EngineResult]:
        """Queue the requests whose images and documents are ready; those that failed are their error lines."""
        failed: list[EngineResult] = []
        for rid, (url, parsed), landed in self._media.ready():
            try:
                if isinstance(landed, BodyError):
                    raise landed
                self._waiting.append(self._sequence(rid, url, Parsed(landed, parsed.reply)))
                self.adapters.started(landed.adapter)
            except BodyError as error:
                self._live.discard(rid)
                failed.append(error.to_result(rid))
        return failed

    def _admit(self) -> None:
        """Move waiting requests into free slots (FIFO), as a step of vLLM's scheduler does first."""
        while self._waiting and len(self._running) < self.max_num_seqs:
            self._running.append(self._waiting.popleft())

    def _decode(self) -> list[EngineResult]:
        """One token for every running request; those that reach their length leave with a result."""
        finished: list[EngineResult] = []
        stepped = list(self._running)
        for sequence in stepped:
            sequence.decode_one()
            if sequence.decoded >= sequence.tokens_to_decode:
                self._running.remove(sequence)
                self._live.discard(sequence.request_id)
                self.adapters.ended(sequence.generation.adapter)
                finished.append(self._result(sequence))
        self._log_step(stepped, finished)
        return finished

    def _log_step(self, stepped: list[_Sequence], finished: list[EngineResult]) -> None:
        """The ledger's record of one step: who generated a token, then who finished (if a ledger is on)."""
        if self.ledger is None:
            return
        self.ledger.step(sequence.request_id for sequence in stepped)
        for result in finished:
            self.ledger.finish(result.request_id, tokens=result.completion_tokens)

    def progress(self, request_ids: Collection[str]) -> dict[str, Progress]:
        """The first choice's token ids so far of each request still waiting or running."""
        wanted = set(request_ids)
        return {
            s.request_id: Progress(list(s.token_ids), s.exact)
            for s in (*self._waiting, *self._running)
            if s.request_id in wanted
        }

    def abort(self, request_ids: list[str]) -> None:
        """Drop requests wherever they are; they produce no result."""
        doomed = set(request_ids)
        if self.ledger is not None:
            self.ledger.abort(sorted(doomed & self._live))
        self._live -= doomed
        self._media.cancel(request_ids)
        for sequence in [*self._running, *self._waiting]:
            if sequence.request_id in doomed:
                self.adapters.ended(sequence.generation.adapter)
        self._waiting = deque(s for s in self._waiting if s.request_id not in doomed)
        self._running = [s for s in self._running if s.request_id not in doomed]

    def cut(self, request_ids: list[str]) -> list[EngineResult]:
        """Answer these requests from the tokens decoded so far (their first choice), then drop them."""
        wanted, answers = set(request_ids), []
        for sequence in (s for s in (*self._waiting, *self._running) if s.request_id in wanted):
            rid = sequence.request_id
            output = Output(rid, response_id=hashlib.sha256(rid.encode()).hexdigest()[:24])
            output.prompt_tokens, output.cached_tokens = sequence.prompt_tokens, sequence.cached_tokens
            output.engine_seconds = time.monotonic() - sequence.added_at
            adapter = sequence.generation.adapter
            model = self.model_name if adapter is None else adapter.name
            text, count = _words(sequence.token_ids), len(sequence.token_ids)
            answer = cut_answer(sequence.parsed, output, text=text, token_count=count, model=model)
            answers += [answer] if answer is not None else []
        self.abort(request_ids)
        return answers

    def stats(self) -> EngineStats:
        """Requests holding a slot, and those queued for one."""
        extra = {"steps": self.steps, **self.adapters.stats()}
        return EngineStats(running=len(self._running), waiting=len(self._waiting), extra=extra)

    def has_unfinished(self) -> bool:
        """True while any request is waiting (for a slot or its images) or running."""
        return bool(self._waiting or self._running or len(self._media))

    def prepare(self, requests: Collection[EngineRequest]) -> None:
        """Nothing to render ahead."""

    def waiting_for_inputs(self) -> int:
        """None: the fake fetches nothing."""
        return 0

    def dispatch_limit(self) -> int | None:
        """No budget: the runner fills every slot."""
        return None

    def set_urgent(self, urgent: bool) -> None:
        """Nothing to lend: the fake engine owns its slots."""

    def close(self) -> None:
        """Nothing to free but the decode ledger's file and the media resolver's threads."""
        self._media.close()
        if self.ledger is not None:
            self.ledger.close()

    def _check_runner(self, generation: Generation, url: str) -> None:
        wanted = generation.kind if generation.pooling else "generate"
        if wanted != self.task:
            raise BodyError(f"model {self.model_name!r} does not serve {url}", code="unsupported_endpoint", param="url")

    def _sequence(self, request_id: str, url: str, parsed: Parsed) -> _Sequence:
        generation = parsed.generation
        self._check_runner(generation, url)
        if generation.pooling:
            if generation.dimensions is not None and not 1 <= generation.dimensions <= EMBEDDING_DIMENSIONS:
                raise BodyError(
                    f"Model {self.model_name!r} only supports dimensions in range [1, {EMBEDDING_DIMENSIONS}], "
                    f"got {generation.dimensions}.",
                    code="invalid_value",
                    param="dimensions",
                )
            prompt_tokens = sum(_count_tokens(item) for item in generation.inputs)
            if generation.messages:  # a classifier's input with images: its text and FAKE_IMAGE_TOKENS an image
                prompt_tokens = _multimodal_tokens(generation)
            return _Sequence(request_id, parsed, prompt_tokens, 1, time.monotonic())
        if generation.kind == "chat":
            prompt_tokens = _multimodal_tokens(generation)
        else:
            assert generation.prompt is not None
            prompt_tokens = _count_tokens(generation.prompt)
        limit = output_budget(generation, prompt_tokens=prompt_tokens, max_model_len=self.max_model_len, default=16)
        check_capabilities(
            generation,
            model=self.model_name,
            tool_parser=self.tool_parser is not None,
            reasoning_parser=self.reasoning_parser is not None,
            max_model_len=self.max_model_len,
        )
        forced_schema(generation)  # a schema that cannot be built fails here, as in the vLLM adapter
        if generation.sampling.min_tokens > limit:
            raise BodyError("min_tokens must not exceed max_tokens", code="invalid_value", param="min_tokens")
        sequence = _Sequence(request_id, parsed, prompt_tokens, limit, time.monotonic())
        sequence.exact = generation.restart_reason() is None
        if generation.kind == "chat":
            sequence.cached_tokens = self._cached_prefix_tokens(generation)
        return sequence

    def _cached_prefix_tokens(self, generation: Generation) -> int:
        """Tokens of a chat prefix (all but the last message) an earlier request already had (then "cached"),
        else 0 (now remembered)."""
        prefix = generation.messages[:-1]
        if not prefix:
            return 0
        key = hashlib.sha256(repr(prefix).encode()).hexdigest()
        if key not in self._cached_prefixes:
            self._cached_prefixes.add(key)
            return 0
        return sum(_count_tokens(text) + 2 for text in generation.turn_texts()[:-1])

    def _result(self, sequence: _Sequence) -> EngineResult:
        rid, generation = sequence.request_id, sequence.generation
        output = Output(
            rid,
            response_id=hashlib.sha256(rid.encode()).hexdigest()[:24],
            prompt_tokens=sequence.prompt_tokens,
            cached_tokens=sequence.cached_tokens,
            engine_seconds=time.monotonic() - sequence.added_at,
        )
        if rid in self.fail_request_ids:
            output.error = server_error(rid, "the fake engine was told to fail this request")
        elif generation.kind == "embed":
            output.vectors = [vector_of(item, generation.dimensions) for item in generation.inputs]
        elif generation.kind == "classify" and generation.messages:
            images = [part[DECODED_IMAGE_PART].size for part in generation.parts(DECODED_IMAGE_PART)]
            output.scores = [scores_of(f"{generation.turn_texts()}/{images}")]
        elif generation.kind == "classify":
            output.scores = [scores_of(item) for item in generation.inputs]
        else:  # the fake decodes to its limit: every sequence stops on its length
            count = sequence.tokens_to_decode
            output.sequences = [
                _shaped(
                    generation,
                    _words(sequence.token_ids) if index == 0 else _text(rid, index, count),
                    count,
                    f"{rid}/{index}",
                )
                for index in range(generation.sampling.n)
            ]
            if sequence.exact:
                output.checkpoint = list(sequence.token_ids)
        adapter = generation.adapter
        return sequence.parsed.answer(output, self.model_name if adapter is None else adapter.name)


def _shaped(generation: Generation, text: str, count: int, seed: str) -> Generated:
    """The fake's answer of `count` words, shaped by what was asked: thinking takes the first half of the words
    (at most the budget; its tokens counted as reasoning); a forced tool choice answers with a call whose
    arguments satisfy simple schemas (worker/engine/tools.py `sample_arguments`); `auto` never calls; structured
    output answers such a value as its text."""
    words = text.split(" ")
    generated = Generated(text=text, token_count=count, finish_reason="length")
    reasoning = generation.reasoning
    if reasoning is not None and reasoning.enabled:
        thinking = count // 2 if reasoning.budget_tokens is None else min(reasoning.budget_tokens, count)
        generated.reasoning, generated.text = " ".join(words[:thinking]), " ".join(words[thinking:])
        generated.reasoning_tokens = thinking
    if (constraint := generation.constraint) is not None:  # structured output: JSON its schema accepts
        value = {} if constraint.json_schema is None else sample_arguments(constraint.json_schema)
        generated.text, generated.finish_reason = json.dumps(value), "stop"
    if generation.tool_choice.forced and generation.tools:
        choice, tools = generation.tool_choice, generation.tools
        tool = next((t for t in tools if t.name == choice.name), tools[0])
        arguments = sample_arguments(tool.parameters)
        answer = arguments if choice.mode == "named" else [{"name": tool.name, "parameters": arguments}]
        calls = forced_calls(json.dumps(answer), generation, derived_ids(seed))
        generated.text, generated.tool_calls, generated.finish_reason = "", calls or [], "tool_calls"
    return generated


def _multimodal_tokens(generation: Generation) -> int:
    """A chat's (or a classifier's input with images) prompt tokens: its turns' words, 2 a turn, and each image."""
    texts = sum(_count_tokens(text) + 2 for text in generation.turn_texts())
    return texts + FAKE_IMAGE_TOKENS * len(generation.parts(DECODED_IMAGE_PART))


def _count_tokens(item: str | list[int]) -> int:
    return len(item) if isinstance(item, list) else max(1, len(item.split()))


def _start(request_id: str, index: int, seed: int | None = None) -> int:
    """Where a choice starts in the word list: another seed (a redraw's) starts it elsewhere."""
    key = f"{request_id}/{index}" if seed is None else f"{request_id}/{index}/{seed}"
    return int(hashlib.sha256(key.encode()).hexdigest(), 16)


def _text(request_id: str, index: int, count: int) -> str:
    start = _start(request_id, index)
    return " ".join(_WORDS[(start + i) % len(_WORDS)] for i in range(count))


def _words(token_ids: list[int]) -> str:
    """The fake's detokenizer: one word per token id."""
    return " ".join(_WORDS[token % len(_WORDS)] for token in token_ids)
