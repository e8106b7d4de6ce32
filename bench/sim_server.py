"""A GPU-timed stand-in for `vllm serve`: the HTTP surface and `/metrics` that shared mode reads, over a scheduler
whose every step lasts storage/planning/step_time.py's time on the target (bench/sim_scheduler.py).

Shared mode (worker/engine/http_engine.py, worker/engine/shared_budget.py) and the online users of
bench/online_load.py talk to it as to a vLLM server started with `--scheduling-policy priority`:

- `POST /v1/chat/completions` and `POST /v1/completions`, plain or streamed (server-sent events, one chunk
  per step that yielded tokens, the usage chunk with `stream_options.include_usage`, then `[DONE]`); the
  body's `priority` (default 0, smaller first) orders admission and preemption; a client that closes its
  connection aborts its request (its slot and KV blocks are free at the next step), as vLLM does;
- `GET /v1/models` (the served name and `max_model_len`), `GET /health`, `POST /tokenize` (a chat's or a
  prompt's token ids; `/v1/completions` takes a prompt of token ids too), `POST /reset_prefix_cache`;
- automatic prefix caching, as vLLM V1 has it on by default (bench/sim_prefix_cache.py);
- `GET /metrics`: `vllm:num_requests_running`, `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc`,
  `vllm:inter_token_latency_seconds_sum`/`_count`, `vllm:num_preemptions_total`, `vllm:prompt_tokens_total`,
  `vllm:generation_tokens_total`, `vllm:prefix_cache_queries_total`/`_hits_total` (tokens), in Prometheus
  text with vLLM's labels;
- `GET /sim/stats` (not vLLM's): the counters as JSON, with the CPU the scheduler spent per step;
  `POST /sim/online-timings`: the TTFT and TPOT of the online requests (priority <= 0) finished since the last
  call, on the server's own timeline (what the GPU did, without the HTTP hop and the client's clock);
  `POST /sim/trace`: every step's make-up and the online requests' times since the last call (the first call
  starts keeping them; bench/shared_sim_tail.py reads them). These reports are bench/sim_reports.py's.

Tokens are counted as the fake engines count them: one per whitespace-separated word of each message, plus 2
per message (its role's marker and an end marker); a word's id is the same wherever it appears, so equal texts
make equal prefixes. Every request runs to its `max_tokens` (as with `ignore_eos`); the text is "x x x ...".

The steps run on a timeline anchored to the clock: step k ends at the start of the busy period plus the
formula's times of steps 0..k, so a wake-up the event loop delivers late (this is a shared 2-core machine)
delays that step's tokens but not the steps after it; only a stall longer than `RESYNC_SECONDS` moves the
timeline (counted in `/sim/stats` as `stalls`). A GPU does not slow down because its host's CPU is busy.

Usage: python bench/sim_server.py --port 8000 [--served-name demo-online] [--hardware 8xH100-SXM]
       [--max-num-seqs 384] [--max-num-batched-tokens 8192] [--gpu-memory-utilization 0.9] [--max-model-len 8192]
       [--long-prefill-token-threshold 0]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.sim_prefix_cache import block_hashes
from bench.sim_reports import SimReports
from bench.sim_scheduler import SimRequest, SimScheduler
from bench.sim_wire import Reply, chat_token_ids, disconnected, read_body, token_ids
from storage.planning.node import HARDWARE_PRESETS, LLAMA_70B_FP8, Hardware, ModelShape

RESYNC_SECONDS = 0.05  # a stall longer than this moves the timeline instead of being caught up
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192  # vLLM's default for its API server on an H100-class GPU


def kv_cache_tokens(shape: ModelShape, hardware: Hardware, gpu_memory_utilization: float) -> int:
    """The KV cache vLLM sizes: `gpu_memory_utilization` of the node's HBM, less the weights, in tokens."""
    spare = hardware.hbm_bytes * gpu_memory_utilization - shape.weight_bytes
    if spare <= 0:
        raise ValueError("the weights do not fit in that share of the node's memory")
    return int(spare // shape.kv_bytes_per_token)


class SimServer(SimReports):
    """The scheduler, its step loop and the HTTP handlers of one simulated server."""

    def __init__(self, scheduler: SimScheduler, *, served_name: str, max_model_len: int) -> None:
        self.scheduler = scheduler
        self.served_name, self.max_model_len = served_name, max_model_len
        self.labels = f'engine="0",model_name="{served_name}"'
        self.scheduler_cpu_seconds = 0.0  # CPU spent planning and applying steps (the per-step overhead)
        self.stalls = 0
        self.max_late_seconds = 0.0
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self.online_timings: list[tuple[float, float | None]] = []  # (TTFT, TPOT) of finished online requests
        self.online_trace: list[dict[str, float]] | None = None  # once /sim/trace was asked: online requests' times

    # -- the step loop ----------------------------------------------------------------------------

    async def run(self) -> None:
        """Plan a step, sleep its formula time (anchored to the busy period's start), apply it; idle on an event."""
        scheduler, next_start = self.scheduler, None
        while True:
            if not scheduler.has_work():
                self._wake.clear()
                await self._wake.wait()
                next_start = None
                continue
            cpu, now = time.thread_time(), time.perf_counter()
            late = 0.0 if next_start is None else now - next_start
            self.max_late_seconds = max(self.max_late_seconds, late)
            if next_start is None or late > RESYNC_SECONDS:
                self.stalls += next_start is not None
                next_start = now
            plan = scheduler.schedule()
            self.scheduler_cpu_seconds += time.thread_time() - cpu
            if plan.empty:  # waiting work the KV cache cannot take yet, nothing running: cannot happen in vLLM
                await asyncio.sleep(0.001)
                next_start = None
                continue
            end = next_start + plan.seconds
            await asyncio.sleep(max(0.0, end - time.perf_counter()))
            while (early := end - time.perf_counter()) > 0:  # the loop's timer may fire a few µs early (seen: 24 µs):
                time.sleep(early)  # the step's tokens never exist before its end
            cpu = time.thread_time()
            scheduler.complete(plan, end)
            self.scheduler_cpu_seconds += time.thread_time() - cpu
            next_start = end

    def submit(self, request: SimRequest) -> None:
        self.scheduler.add(request)
        self._wake.set()

    # -- HTTP -------------------------------------------------------------------------------------

    async def chat(self, request: Request) -> Response:
        if (body := await read_body(request)) is None:
            return Response(status_code=499)
        return await self._serve(request, body, chat_token_ids(body.get("messages") or []), chat=True)

    async def completions(self, request: Request) -> Response:
        if (body := await read_body(request)) is None:
            return Response(status_code=499)
        return await self._serve(request, body, token_ids(body.get("prompt")), chat=False)

    async def tokenize(self, request: Request) -> Response:
        """vLLM's `POST /tokenize`: a chat's (`messages`) or a prompt's token ids, as the endpoints count them."""
        body = await request.json()
        ids = chat_token_ids(body["messages"]) if "messages" in body else token_ids(body.get("prompt"))
        return JSONResponse({"count": len(ids), "max_model_len": self.max_model_len, "tokens": ids})

    async def reset_prefix_cache(self, _: Request) -> Response:
        """vLLM's `POST /reset_prefix_cache` (a dev-mode endpoint there): forget the free cached blocks."""
        self.scheduler.prefix_cache.reset()
        return Response(status_code=200)

    async def _serve(self, request: Request, body: dict[str, Any], ids: list[int], *, chat: bool) -> Response:
        prompt = len(ids)
        room = self.max_model_len - prompt
        wanted = body.get("max_completion_tokens") or body.get("max_tokens") or (room if chat else 16)
        if room < 1 or wanted > room:
            message = (
                f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                f"{wanted} output tokens and your prompt contains {prompt} input tokens."
            )
            error = {"message": message, "type": "BadRequestError", "param": None, "code": 400}
            return JSONResponse({"error": error}, status_code=400)
        sim = SimRequest(
            prompt_tokens=prompt,
            max_tokens=int(wanted),
            priority=int(body.get("priority") or 0),
            arrival=time.perf_counter(),
            stream=bool(body.get("stream")),
            block_hashes=block_hashes(ids),
        )
        reply = Reply(self.served_name, chat=chat, prompt=prompt)
        if sim.stream:
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return StreamingResponse(self._stream(sim, reply, include_usage), media_type="text/event-stream")
        done = asyncio.Event()
        sim.on_tokens = lambda r: done.set() if r.finished_at is not None else None
        self.submit(sim)
        finished = asyncio.ensure_future(done.wait())
        gone = asyncio.ensure_future(disconnected(request))
        await asyncio.wait({finished, gone}, return_when=asyncio.FIRST_COMPLETED)
        for task in (finished, gone):
            task.cancel()
        if not done.is_set():  # the client closed the connection: abort, as vLLM does
            self.scheduler.abort(sim)
            return Response(status_code=499)
        self._record(sim)
        return Response(orjson.dumps(reply.whole(sim.output_tokens)), media_type="application/json")

    async def _stream(self, sim: SimRequest, reply: Reply, include_usage: bool) -> AsyncIterator[bytes]:
        ready = asyncio.Event()
        sim.on_tokens = lambda _: ready.set()
        self.submit(sim)
        sent, first_sent = 0, 0.0
        try:
            while sim.finished_at is None:
                await ready.wait()
                ready.clear()
                count = sim.output_tokens - sent
                if count > 0:
                    last = sim.finished_at is not None
                    first_sent = first_sent or time.perf_counter()
                    yield reply.chunk(count, first=sent == 0, finish="length" if last else None)
                    sent += count
            if include_usage:
                yield reply.usage_chunk(sent)
            yield b"data: [DONE]\n\n"
        finally:
            if sim.finished_at is None:
                self.scheduler.abort(sim)
            else:
                self._record(sim, first_sent)

    async def models(self, _: Request) -> Response:
        card = {"id": self.served_name, "object": "model", "owned_by": "sim", "max_model_len": self.max_model_len}
        return JSONResponse({"object": "list", "data": [card]})

    async def health(self, _: Request) -> Response:
        return Response(status_code=200)

    # -- the app ----------------------------------------------------------------------------------

    def app(self) -> Starlette:
        @contextlib.asynccontextmanager
        async def lifespan(_: Starlette) -> AsyncIterator[None]:
            self._wake = asyncio.Event()  # bound to the server's own loop
            self._loop_task = asyncio.create_task(self.run())
            yield
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task

        routes = [
            Route("/v1/chat/completions", self.chat, methods=["POST"]),
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/v1/models", self.models),
            Route("/tokenize", self.tokenize, methods=["POST"]),
            Route("/reset_prefix_cache", self.reset_prefix_cache, methods=["POST"]),
            Route("/metrics", self.metrics),
            Route("/sim/stats", self.stats),
            Route("/sim/online-timings", self.timings, methods=["POST"]),
            Route("/sim/trace", self.trace, methods=["POST"]),
            Route("/health", self.health),
        ]
        return Starlette(routes=routes, lifespan=lifespan)


def build(
    *,
    served_name: str,
    hardware: str = "8xH100-SXM",
    shape: ModelShape = LLAMA_70B_FP8,
    max_num_seqs: int = 384,
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
    gpu_memory_utilization: float = 0.9,
    max_model_len: int = 8192,
    long_prefill_token_threshold: int = 0,
) -> SimServer:
    """A simulated server for a planner hardware preset (70B FP8 weights and KV by default)."""
    node = HARDWARE_PRESETS[hardware]
    scheduler = SimScheduler(
        shape=shape,
        hardware=node,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        kv_cache_tokens=kv_cache_tokens(shape, node, gpu_memory_utilization),
        long_prefill_token_threshold=long_prefill_token_threshold,
    )
    return SimServer(scheduler, served_name=served_name, max_model_len=max_model_len)


def start(
    *, served_name: str, log: Path, nice: int = 0, extra: list[str] | None = None, ready_seconds: float = 60
) -> tuple[subprocess.Popen[bytes], str]:
    """This server as a child process on a free port (its own process group, the caller's session); wait for /health."""
    import httpx

    from bench.vllm_server import ServerFailed, free_port, stop

    port = free_port()
    command = [sys.executable, __file__, "--port", str(port), "--served-name", served_name, *(extra or [])]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, process_group=0, preexec_fn=lambda: _renice(nice)
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + ready_seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServerFailed(f"the simulated server exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return proc, url
        time.sleep(0.2)
    stop(proc)
    raise ServerFailed(f"the simulated server was not healthy after {ready_seconds:.0f} s:\n{log.read_text()[-3000:]}")


def _renice(nice: int) -> None:
    if nice:
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, 0, nice)


def main() -> int:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--served-name", default="demo-online")
    parser.add_argument("--hardware", default="8xH100-SXM", choices=sorted(HARDWARE_PRESETS))
    parser.add_argument("--max-num-seqs", type=int, default=384)
    parser.add_argument("--max-num-batched-tokens", type=int, default=DEFAULT_MAX_NUM_BATCHED_TOKENS)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    parser.add_argument("--max-model-len", type=int, default=8192)
    parser.add_argument("--long-prefill-token-threshold", type=int, default=0)
    args = parser.parse_args()
    server = build(
        served_name=args.served_name,
        hardware=args.hardware,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        gpu_memory_utilization=args.gpu_memory_utilization,
        max_model_len=args.max_model_len,
        long_prefill_token_threshold=args.long_prefill_token_threshold,
    )
    uvicorn.run(server.app(), host=args.host, port=args.port, log_level="warning", access_log=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
