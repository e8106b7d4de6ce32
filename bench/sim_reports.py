"""What the simulated server (bench/sim_server.py) reports of itself, apart from its answers: vLLM's `/metrics`
in Prometheus text, and the simulator's own `/sim/stats`, `/sim/online-timings` and `/sim/trace` (the online
requests' TTFT and TPOT on the server's own timeline, every step's make-up).

A mixin of `SimServer`, kept apart so the server's module holds its step loop and the vLLM endpoints it serves.
"""

from __future__ import annotations

import dataclasses
import time

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from bench.sim_scheduler import SimRequest, SimScheduler


class SimReports:
    """The counters and timings `SimServer` keeps, and the endpoints that read them."""

    scheduler: SimScheduler
    labels: str
    scheduler_cpu_seconds: float
    stalls: int
    max_late_seconds: float
    online_timings: list[tuple[float, float | None]]
    online_trace: list[dict[str, float]] | None

    def _record(self, sim: SimRequest, first_sent: float = 0.0) -> None:
        """Keep an online request's TTFT and TPOT on the server's own timeline (no HTTP, no client in them)."""
        if sim.priority > 0 or sim.first_token_at is None or sim.finished_at is None:
            return
        tpot = (sim.finished_at - sim.first_token_at) / (sim.output_tokens - 1) if sim.output_tokens > 1 else None
        self.online_timings.append((sim.first_token_at - sim.arrival, tpot))
        if self.online_trace is not None:  # `first_sent`: its first chunk left (the event loop's delay after the step)
            self.online_trace.append(
                {"arrival": sim.arrival, "first_token": sim.first_token_at, "first_sent": first_sent}
            )

    async def trace(self, _: Request) -> Response:
        """The steps and the online requests finished since the last call (the first call starts keeping them)."""
        (steps, self.scheduler.trace), (online, self.online_trace) = (self.scheduler.trace, []), (self.online_trace, [])
        return JSONResponse({"steps": [dataclasses.astuple(step) for step in steps or []], "online": online or []})

    async def timings(self, _: Request) -> Response:
        """The online requests finished since the last call (and forget them): [[ttft, tpot], ...] in seconds."""
        taken, self.online_timings = self.online_timings, []
        return JSONResponse(taken)

    async def metrics(self, _: Request) -> Response:
        s, c, labels = self.scheduler, self.scheduler.counters, self.labels
        generated = c.generation_tokens["online"] + c.generation_tokens["batch"]
        lines = [
            ("# TYPE vllm:num_requests_running gauge", None),
            ("vllm:num_requests_running", s.running_count),
            ("# TYPE vllm:num_requests_waiting gauge", None),
            ("vllm:num_requests_waiting", s.waiting_count),
            ("# TYPE vllm:kv_cache_usage_perc gauge", None),
            ("vllm:kv_cache_usage_perc", round(s.kv_usage(), 6)),
            ("# TYPE vllm:num_preemptions_total counter", None),
            ("vllm:num_preemptions_total", c.preemptions),
            ("# TYPE vllm:prompt_tokens_total counter", None),
            ("vllm:prompt_tokens_total", c.prompt_tokens),
            ("# TYPE vllm:generation_tokens_total counter", None),
            ("vllm:generation_tokens_total", generated),
            ("# TYPE vllm:inter_token_latency_seconds histogram", None),
            ("vllm:inter_token_latency_seconds_sum", round(c.itl_seconds, 6)),
            ("vllm:inter_token_latency_seconds_count", c.itl_tokens),
            ("# TYPE vllm:prefix_cache_queries counter", None),
            ("vllm:prefix_cache_queries_total", s.prefix_cache.queries),
            ("# TYPE vllm:prefix_cache_hits counter", None),
            ("vllm:prefix_cache_hits_total", s.prefix_cache.hits),
        ]
        text = "\n".join(name if value is None else f"{name}{{{labels}}} {value}" for name, value in lines)
        return PlainTextResponse(text + "\n")

    async def stats(self, _: Request) -> Response:
        s, c = self.scheduler, self.scheduler.counters
        return JSONResponse(
            {
                "steps": c.steps,
                "busy_seconds": round(c.busy_seconds, 6),
                "prompt_tokens": c.prompt_tokens,
                "generation_tokens": c.generation_tokens,
                "preemptions": c.preemptions,
                "prefix_cache_queries": s.prefix_cache.queries,
                "prefix_cache_hits": s.prefix_cache.hits,
                "finished": c.finished,
                "aborted": c.aborted,
                "scheduler_cpu_seconds": round(self.scheduler_cpu_seconds, 6),
                "scheduler_cpu_us_per_step": round(1e6 * self.scheduler_cpu_seconds / max(1, c.steps), 1),
                "process_cpu_seconds": round(time.process_time(), 3),
                "stalls": self.stalls,
                "max_late_ms": round(1e3 * self.max_late_seconds, 3),
                "running": self.scheduler.running_count,
                "waiting": self.scheduler.waiting_count,
            }
        )
