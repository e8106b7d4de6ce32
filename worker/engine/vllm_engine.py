"""The vLLM adapter: the only module that imports vLLM.

One in-process v1 `LLMEngine`, loaded once and kept warm, fed continuously: `add()` renders and submits a request
at once, `step()` runs one scheduler iteration and hands back whatever finished in it. vLLM's scheduler does the
continuous batching; this module only turns neutral generations (worker/engine/generation.py, read off each line
by its protocol's wire module) into vLLM's inputs and vLLM's outputs back. Not thread-safe: call it from one thread.
"""

from __future__ import annotations

import copy
import dataclasses
import gc
import logging
import threading
import time
from collections.abc import Collection
from typing import Any

from storage.registry import ModelSpec
from worker.engine import EngineRequest, EngineResult, EngineStats, Progress, error_result
from worker.engine.adapters import under_adapter
from worker.engine.generation import Adapter
from worker.engine.media_waits import MediaWaits
from worker.engine.vllm_ahead import AheadRenders
from worker.engine.vllm_chat import DirectChat
from worker.engine.vllm_inputs import VllmInputs
from worker.engine.vllm_lora import Loras, lora_engine_args
from worker.engine.vllm_outputs import InFlight, cut_result, generated_ids, invalid_result, result_of
from worker.engine.vllm_parsers import Parsers, engine_kwargs
from worker.engine.vllm_process import close_at_exit, forget_import_tracebacks, set_env_defaults
from worker.engine.vllm_resume import EndedHere, Resume, boundary_stop, continue_from, exact_params
from worker.engine.wire import Parsed, parse
from worker.engine.wire.base import BodyError, server_error

logger = logging.getLogger(__name__)

MEDIA_WAIT_SECONDS = 0.05  # a step with nothing to run but lines waiting for their images sleeps this long at most
_open = [0]  # this process's engines not yet closed
_open_lock = threading.Lock()


def _guard_parallel_state() -> None:
    """vLLM's in-process shutdown tears down the parallel state all engines share: kept while another is open."""
    from vllm.v1.engine import core as vllm_core

    core: Any = vllm_core  # its module global is what shutdown() calls
    if not getattr(core, "backfill_guarded", False):
        teardown, core.backfill_guarded = core.cleanup_dist_env_and_memory, True
        core.cleanup_dist_env_and_memory = lambda *a, **k: gc.collect() if _open[0] else teardown(*a, **k)


class VllmEngine(VllmInputs):
    """The Engine protocol on an in-process vLLM v1 LLMEngine (its inputs built by `VllmInputs`)."""

    def __init__(self, model_name: str, spec: ModelSpec, *, media: MediaWaits[Parsed] | None = None) -> None:
        set_env_defaults(spec)
        from vllm import EngineArgs, LLMEngine

        forget_import_tracebacks()
        args = EngineArgs(
            model=spec.path,
            served_model_name=model_name,  # vLLM's own messages name the model as users know it, never its path
            runner=spec.runner,  # type: ignore[arg-type]
            tensor_parallel_size=spec.tensor_parallel_size,
            max_num_seqs=spec.resolved_max_num_seqs(),
            max_num_batched_tokens=spec.max_num_batched_tokens,
            max_model_len=spec.max_model_len,  # type: ignore[arg-type]
            dtype=spec.dtype,  # type: ignore[arg-type]
            enforce_eager=spec.enforce_eager,
            gpu_memory_utilization=spec.gpu_memory_utilization,
            kv_cache_memory_bytes=spec.kv_cache_memory_bytes,
            disable_log_stats=True,  # stats() reads the scheduler directly
            # the structured-outputs backend, a pooling task, the reasoning parser (vllm_parsers.py), the extras
            **engine_kwargs(spec, spec.engine_extra()),
            **lora_engine_args(spec),  # LoRA adapters packed in this engine (vllm_lora.py)
        )
        started = time.monotonic()
        _guard_parallel_state()
        self._engine = LLMEngine.from_engine_args(args)
        with _open_lock:
            _open[0] += 1
        close_at_exit(self)
        self._loras = Loras(self._engine, spec) if spec.takes_adapters else None
        self.load_seconds = time.monotonic() - started
        self.model_name = model_name
        self.max_num_seqs: int = self._engine.vllm_config.scheduler_config.max_num_seqs
        self._model_config = self._engine.model_config
        self._max_model_len: int = self._model_config.max_model_len
        self._tasks = set(self._engine.get_supported_tasks())
        # A classifier's label of each probability it returns (its config's id2label), in index order.
        id2label = getattr(self._model_config.hf_config, "id2label", None) or {}
        self._labels = [str(id2label[index]) for index in sorted(id2label)] if "classify" in self._tasks else []
        self._defaults: dict[str, Any] = self._model_config.get_diff_sampling_param()
        self._inflight: dict[str, InFlight] = {}
        self._open_windows: dict[str, InFlight] = {}  # resumed, a stop string may span: what a step checks
        self._owner: dict[str, str] = {}  # engine request id -> our request id
        # Lines whose images and documents are being fetched and decoded on the media resolver's threads
        # (worker/engine/media.py); `step` submits them once they land.
        self._media: MediaWaits[Parsed] = media if media is not None else MediaWaits()
        self._prefix_queries = self._prefix_hits = 0  # prompt tokens of finished requests; those the cache served
        self.closed = False
        self._renderer = self._engine.renderer
        self._tokenizer: Any = None  # a generating model's (an embedding model has none to decode with)
        self._direct: DirectChat | None = None  # chat prompts without the renderer's overhead (vllm_chat.py)
        self._ahead: AheadRenders | None = None  # chat requests the claimer's thread renders (vllm_ahead.py)
        self._parsers: Parsers | None = None  # the model's tool-call and reasoning parsers (vllm_parsers.py)
        if "generate" in self._tasks:
            self._tokenizer = self._engine.get_tokenizer()
            self._parsers = Parsers(spec, self._tokenizer, model_name=model_name, max_model_len=self._max_model_len)
            self._renderer.warmup(self._chat_params())
            self._direct = DirectChat.probe(self._tokenizer, max_model_len=self._max_model_len, render=self._render)
            own = copy.deepcopy(self._tokenizer)  # the other thread's: a tokenizer is never shared between threads
            if ahead := DirectChat.probe(own, max_model_len=self._max_model_len, render=self._render):
                self._ahead = AheadRenders(ahead, self._render_ahead, capacity=16 * self.max_num_seqs)

    # -- the Engine protocol ---------------------------------------------------------------------

    def add(self, request: EngineRequest) -> EngineResult | None:
        """Render and submit a request; a body that cannot run comes back as an error result. A request with images
        or documents waits for them off this thread (worker/engine/media.py) and is submitted by a later `step`."""
        rid = request.request_id
        ahead = self._ahead.take(rid) if self._ahead is not None else None
        if ahead is not None and not request.resume_token_ids and rid not in self._inflight:
            return self._submit(rid, under_adapter(ahead.parsed, request), ahead.prepared, exact=ahead.exact)
        try:
            if rid in self._inflight or rid in self._media:
                raise BodyError(f"request {rid!r} is already in flight", code="duplicate_request")
            parsed = under_adapter(parse(request.url, request.body, seed=request.seed), request)
            generation = parsed.generation
            self._check_kind(generation, request.url)
            if generation.needs_media():
                self._check_media(generation)
                self._media.start(rid, generation, parsed)
                return None
            prepared = self._prepare(rid, generation)
            exact = generation.restart_reason() is None and exact_params(prepared[0][2])
            resume = None
            if exact and request.resume_token_ids:
                prepared, resume = continue_from(prepared[0], list(request.resume_token_ids), self._tokenizer)
        except Exception as error:
            return self._refused(rid, error)
        return self._submit(rid, parsed, prepared, exact=exact, resume=resume)

    def _refused(self, rid: str, error: Exception) -> EngineResult:
        """The error line of a request that cannot be rendered or submitted."""
        from vllm.exceptions import VLLMClientError

        if isinstance(error, BodyError):
            return error.to_result(rid)
        if isinstance(error, (VLLMClientError, ValueError, TypeError, LookupError)):
            return invalid_result(rid, error)
        # a template or tokenizer failure on this body alone
        logger.error("rendering request %s failed", rid, exc_info=error)
        return error_result(rid, 400, f"could not render the request: {error}", code="invalid_value")

    def _media_landed(self) -> list[EngineResult]:
        """Submit the requests whose images and documents are ready; those that failed are their error lines."""
        results: list[EngineResult] = []
        for rid, parsed, landed in self._media.ready():
            if isinstance(landed, BodyError):
                results.append(landed.to_result(rid))
                continue
            parsed = dataclasses.replace(parsed, generation=landed)
            try:
                prepared = self._prepare(rid, landed)  # vLLM's multimodal processor runs here, on this thread
            except Exception as error:
                results.append(self._refused(rid, error))
                continue
            if (refused := self._submit(rid, parsed, prepared)) is not None:
                results.append(refused)
        return results

    def prepare(self, requests: Collection[EngineRequest]) -> None:
        """Render chat requests ahead, on the calling thread (the runner's claimer), off the engine's."""
        if self._ahead is not None:
            self._ahead.prepare(requests)

    def step(self) -> list[EngineResult]:
        """Run one engine iteration; return the requests that finished in it (or whose images failed)."""
        results = self._media_landed()
        if not self._inflight and len(self._media):  # nothing to run until a line's images land
            self._media.wait(MEDIA_WAIT_SECONDS)
            return results + self._media_landed()
        outputs = self._engine.step()
        now = time.monotonic()
        for output in outputs:
            owner = self._owner.pop(output.request_id, None) if output.finished else None
            if owner is None:  # still running, or aborted before this step
                continue
            flight = self._inflight[owner]
            flight.done[output.request_id] = output
            if len(flight.done) == len(flight.engine_ids):
                del self._inflight[owner]
                self._ended(flight)
                results.append(self._finish(flight, now))
        results.extend(self._boundary_stops(now))
        if self._inflight and not self._engine.has_unfinished_requests():
            results.extend(self._drop_lost())
        return results

    def progress(self, request_ids: Collection[str]) -> dict[str, Progress]:
        """Token ids generated so far (a resumed request's earlier ones first), read off vLLM's output processor."""
        answer: dict[str, Progress] = {}
        for rid in request_ids:
            flight = self._inflight.get(rid)
            if flight is None or flight.parsed.generation.kind == "embed":
                continue
            earlier = flight.resume.token_ids if flight.resume is not None else []
            answer[rid] = Progress(
                earlier + generated_ids(self._engine.output_processor, flight.engine_ids[0]), flight.exact
            )
        return answer

    def abort(self, request_ids: list[str]) -> None:
        """Forget requests and free their sequences in the engine at once; they yield no result."""
        self._media.cancel(request_ids)
        engine_ids: list[str] = []
        for rid in request_ids:
            flight = self._inflight.pop(rid, None)
            if flight is not None:
                self._ended(flight)
                engine_ids.extend(flight.engine_ids)
                for engine_id in flight.engine_ids:
                    self._owner.pop(engine_id, None)
        if engine_ids:
            self._engine.abort_request(engine_ids)

    def cut(self, request_ids: list[str]) -> list[EngineResult]:
        """Answer these requests from the tokens generated so far, then free their sequences (cuts.py)."""
        processor, flights = self._engine.output_processor, [self._inflight.get(rid) for rid in request_ids]
        cut = [
            cut_result(f, model=self.model_name, tokenizer=self._tokenizer, processor=processor) for f in flights if f
        ]
        self.abort(request_ids)
        return [answer for answer in cut if answer is not None]

    def stats(self) -> EngineStats:
        """The scheduler's own counts of sequences (n>1 choices and embedding inputs count singly): in-process,
        vLLM's `vllm:num_requests_running` / `_waiting` (preempted sequences wait again); a multiprocess engine's
        (`VLLM_ENABLE_V1_MULTIPROCESSING=1`) scheduler is in another process: estimated from what is in flight."""
        core = getattr(self._engine.engine_core, "engine_core", None)
        extra: dict[str, Any] = {
            "requests_in_flight": len(self._inflight),
            # Cumulative over finished requests, from each output's `num_cached_tokens`, like vLLM's
            # vllm:prefix_cache_queries_total / vllm:prefix_cache_hits_total (tokens).
            "prefix_cache_queries": self._prefix_queries,
            "prefix_cache_hits": self._prefix_hits,
            **(self._loras.tally.stats() if self._loras is not None else {}),
        }
        if core is None:
            sequences = len(self._owner)
            running = min(sequences, self.max_num_seqs)
            return EngineStats(running=running, waiting=sequences - running, extra={**extra, "estimated": True})
        running, waiting = core.scheduler.get_request_counts()
        extra["kv_cache_usage"] = core.scheduler.get_kv_cache_usage()
        extra["media_waiting"] = len(self._media)  # accepted, their images on their way: waiting too
        return EngineStats(running=running, waiting=waiting + len(self._media), extra=extra)

    def has_unfinished(self) -> bool:
        """True while a submitted request has neither finished nor been aborted."""
        return bool(self._inflight) or bool(len(self._media))

    def waiting_for_inputs(self) -> int:
        """Lines whose images or documents are still being fetched and decoded (worker/engine/media.py)."""
        return len(self._media)

    def dispatch_limit(self) -> int | None:
        """No budget: this engine owns its hardware, the runner fills it."""
        return None

    def set_urgent(self, urgent: bool) -> None:
        """Nothing to lend: urgency only orders claims for an engine of our own."""

    def close(self) -> None:
        """Abort everything and release the engine's workers."""
        if not self.closed:  # once: a switch closes it, then the exit hook (vllm_process.close_at_exit) finds it closed
            self.closed = True
            self.abort(list(self._inflight))
            self._media.close()
            with _open_lock:
                _open[0] -= 1
            self._engine.engine_core.shutdown()

    def _submit(
        self,
        rid: str,
        parsed: Parsed,
        prepared: list[tuple[str, Any, Any]],
        *,
        exact: bool = False,
        resume: Resume | None = None,
    ) -> EngineResult | None:
        from vllm.exceptions import VLLMClientError

        added: list[str] = []
        adapter = parsed.generation.adapter
        try:
            lora = self._lora_request(adapter)
            for engine_id, prompt, params in prepared:
                self._engine.add_request(engine_id, prompt, params, lora_request=lora)
                added.append(engine_id)
        except Exception as error:
            if added:
                self._engine.abort_request(added)
            if isinstance(error, BodyError):
                return error.to_result(rid)
            if isinstance(error, (VLLMClientError, ValueError, TypeError)):
                return invalid_result(rid, error, parsed.generation)
            logger.exception("engine refused request %s", rid)
            return server_error(rid, f"the engine could not accept the request: {error}")
        engine_ids = [engine_id for engine_id, _, _ in prepared]
        if self._loras is not None:
            self._loras.tally.started(adapter)
        self._inflight[rid] = InFlight(rid, parsed, time.monotonic(), engine_ids, exact=exact, resume=resume)
        if resume is not None and resume.window_open:
            self._open_windows[rid] = self._inflight[rid]
        self._owner.update((engine_id, rid) for engine_id, _, _ in prepared)
        return None

    # -- results out ---------------------------------------------------------------------------

    def _lora_request(self, adapter: Adapter | None) -> Any:
        """The LoRARequest a generation runs under (vllm_lora.py); None on a model without adapters."""
        if self._loras is not None:
            return self._loras.request_for(adapter)
        if adapter is not None:
            raise BodyError(f"model {self.model_name!r} takes no adapters", code="model_not_found", status_code=404)
        return None

    def _ended(self, flight: InFlight) -> None:
        if self._loras is not None:
            self._loras.tally.ended(flight.parsed.generation.adapter)

    def _finish(self, flight: InFlight, now: float) -> EngineResult:
        adapter = flight.parsed.generation.adapter
        try:
            result = result_of(
                flight,
                model_name=self.model_name if adapter is None else adapter.name,  # as vLLM's server names a LoRA
                tokenizer=self._tokenizer,
                tally=self._tally_prefix,
                parsers=self._parsers,
                labels=self._labels,
            )
        except Exception as error:  # one bad sequence must not take the batch down
            logger.exception("building the result of %s failed", flight.request_id)
            result = server_error(flight.request_id, f"the engine failed on this request: {error}")
        result.engine_seconds = now - flight.started
        return result

    def _tally_prefix(self, prompt_tokens: int, cached_tokens: int) -> None:
        self._prefix_queries += prompt_tokens
        self._prefix_hits += cached_tokens

    # -- resuming from a checkpoint (worker/engine/vllm_resume.py) ---------------------------------

    def _boundary_stops(self, now: float) -> list[EngineResult]:
        """Resumed requests whose stop string, begun before the hand-back, completed in this step."""
        results: list[EngineResult] = []
        for rid, flight in list(self._open_windows.items()):
            assert flight.resume is not None
            if self._inflight.get(rid) is not flight or not flight.resume.window_open:
                del self._open_windows[rid]  # finished, lost, or past the point where a stop could span
                continue
            new_ids = generated_ids(self._engine.output_processor, flight.engine_ids[0])
            if boundary_stop(flight.resume, new_ids):
                self.abort([flight.request_id])
                flight.done[flight.engine_ids[0]] = EndedHere(new_ids)
                results.append(self._finish(flight, now))
        return results

    def _drop_lost(self) -> list[EngineResult]:
        """The engine holds nothing yet requests are in flight: fail them rather than wait forever."""
        lost = list(self._inflight.values())
        for flight in lost:
            self._ended(flight)
        self._inflight.clear()
        self._owner.clear()
        logger.error("engine lost %d requests", len(lost))
        return [server_error(f.request_id, "the engine dropped this request") for f in lost]
