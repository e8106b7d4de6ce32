"""`backfill plan`: the roofline table for a model on a node, from a few numbers or a config.json, with the
prefill clock and the cost of a job (by default one whose prompts dominate: 2,000 tokens in, 10 out)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from storage.planning.roofline import (
    BOUNDS,
    GB,
    HARDWARE_PRESETS,
    KV_DTYPE_BYTES,
    WEIGHT_DTYPE_BYTES,
    Hardware,
    Job,
    ModelShape,
    Plan,
    plan,
)
from storage.planning.step_time import DEFAULT_MAX_NUM_BATCHED_TOKENS, JobEstimate

DEFAULT_HARDWARE = "8xH100-SXM"
_WIDTHS = (6, 8, 11, 11, 9, 10, 5)


class PlanInputError(ValueError):
    """Bad command-line input; reported as one line on stderr with exit code 2."""


def register(subparsers: Any) -> None:
    """Add the `plan` subcommand to the CLI's subparsers."""
    parser = subparsers.add_parser(
        "plan",
        help="roofline cost per token and latency by batch size, prefill and a job's cost",
        description="Decode-step roofline: TPOT, tokens/s and $ per 1M tokens at each batch size; the "
        "prefill rate (compute-bound); and a job of identical requests on a fully fed engine (both clocks, $).",
    )
    model = parser.add_argument_group("model (either --config-json or both numbers)")
    model.add_argument("--config-json", type=Path, help="a HuggingFace config.json to estimate from")
    model.add_argument("--weight-dtype", choices=list(WEIGHT_DTYPE_BYTES), help="with --config-json")
    model.add_argument("--kv-dtype", choices=list(KV_DTYPE_BYTES), help="with --config-json")
    model.add_argument("--weights-gb", type=float, help="weight bytes / 1e9")
    model.add_argument("--kv-bytes-per-token", type=float, help="KV cache bytes per token of context")
    hardware = parser.add_argument_group("hardware (a preset; numbers override its fields)")
    hardware.add_argument("--hardware", help=f"preset: {', '.join(HARDWARE_PRESETS)} (default {DEFAULT_HARDWARE})")
    hardware.add_argument("--gpus", type=int, help="GPUs in the node")
    hardware.add_argument("--hbm-gb", type=float, help="HBM per GPU, GB (1e9 bytes)")
    hardware.add_argument("--hbm-tbps", type=float, help="HBM bandwidth per GPU, TB/s")
    hardware.add_argument("--gpu-hour-usd", help="rental price per GPU-hour, USD")
    hardware.add_argument("--efficiency", type=float, help="share of the dense FLOP/s a prefill reaches (0.5)")
    job = parser.add_argument_group("job (costed on a fully fed engine with chunked prefill)")
    job.add_argument("--requests", type=int, default=10_000, help="requests in the job (default 10,000)")
    job.add_argument("--prompt-tokens", type=int, default=2000, help="prompt tokens per request (default 2,000)")
    job.add_argument("--output-tokens", type=int, default=10, help="output tokens per request (default 10)")
    job.add_argument("--max-num-seqs", type=int, help="engine slots (default: the most that fit, at most 1,024)")
    job.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=DEFAULT_MAX_NUM_BATCHED_TOKENS,
        help=f"tokens per step (default {DEFAULT_MAX_NUM_BATCHED_TOKENS:,}, vLLM's on H100)",
    )
    parser.add_argument("--context", type=int, default=4096, help="tokens per sequence (default 4096)")
    parser.add_argument("--batch-sizes", help="comma-separated, e.g. 1,8,32 (default: powers of 2, knee, max)")
    parser.add_argument("--format", choices=["table", "json"], default="table")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print the plan; 2 with a one-line error on bad input."""
    try:
        result = plan(
            _model(args), _hardware(args), _positive("--context", args.context), _batch_sizes(args), job=_job(args)
        )
    except ValueError as error:  # PlanInputError and the planner's own checks
        print(f"backfill plan: error: {error}", file=sys.stderr)
        return 2
    if args.format == "json":
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(render_table(result))
    return 0


def _positive(flag: str, value: float | None) -> Any:
    """The value if it is None or inside the planner's bound for this input (roofline.BOUNDS)."""
    if value is not None and not value > 0:
        raise PlanInputError(f"{flag} must be positive, got {value}")
    if value is not None:
        BOUNDS[flag.removeprefix("--").replace("-", "_")].check(flag, value)
    return value


def _model(args: argparse.Namespace) -> ModelShape:
    weights = _positive("--weights-gb", args.weights_gb)
    kv = _positive("--kv-bytes-per-token", args.kv_bytes_per_token)
    if args.config_json is not None:
        base = ModelShape.from_hf_config(
            _read_config(args.config_json), weight_dtype=args.weight_dtype, kv_dtype=args.kv_dtype
        )
        return ModelShape(weights * GB if weights else base.weight_bytes, kv or base.kv_bytes_per_token)
    if weights is None or kv is None:
        raise PlanInputError("give --config-json PATH, or both --weights-gb and --kv-bytes-per-token")
    return ModelShape(weight_bytes=weights * GB, kv_bytes_per_token=kv)


def _read_config(path: Path) -> dict[str, Any]:
    try:
        config = json.loads(path.read_text())
    except OSError as error:
        raise PlanInputError(f"cannot read --config-json {path}: {error.strerror}") from None
    except json.JSONDecodeError as error:
        raise PlanInputError(f"--config-json {path} is not JSON: {error.msg} at line {error.lineno}") from None
    if not isinstance(config, dict):
        raise PlanInputError(f"--config-json {path} is not a JSON object")
    return config


def _hardware(args: argparse.Namespace) -> Hardware:
    name = args.hardware or DEFAULT_HARDWARE
    if name not in HARDWARE_PRESETS:
        raise PlanInputError(f"unknown hardware preset {name!r}: use one of {', '.join(HARDWARE_PRESETS)}")
    base = HARDWARE_PRESETS[name]
    hbm_gb = _positive("--hbm-gb", args.hbm_gb)
    hbm_tbps = _positive("--hbm-tbps", args.hbm_tbps)
    efficiency = _positive("--efficiency", args.efficiency)
    return dataclasses.replace(
        base,
        gpus=_positive("--gpus", args.gpus) or base.gpus,
        hbm_bytes_per_gpu=hbm_gb * GB if hbm_gb else base.hbm_bytes_per_gpu,
        hbm_bandwidth_bytes_per_s_per_gpu=hbm_tbps * 1e12 if hbm_tbps else base.hbm_bandwidth_bytes_per_s_per_gpu,
        usd_per_gpu_hour=_usd(args.gpu_hour_usd) if args.gpu_hour_usd is not None else base.usd_per_gpu_hour,
        compute_efficiency=efficiency or base.compute_efficiency,
    )


def _job(args: argparse.Namespace) -> Job:
    return Job(
        requests=_positive("--requests", args.requests),
        prompt_tokens=_positive("--prompt-tokens", args.prompt_tokens),
        output_tokens=_positive("--output-tokens", args.output_tokens),
        max_num_seqs=_positive("--max-num-seqs", args.max_num_seqs),
        max_num_batched_tokens=_positive("--max-num-batched-tokens", args.max_num_batched_tokens),
    )


def _usd(text: str) -> Decimal:
    try:
        value = Decimal(text)
    except InvalidOperation:
        raise PlanInputError(f"--gpu-hour-usd must be a number, got {text!r}") from None
    if not value.is_finite() or value <= 0:
        raise PlanInputError(f"--gpu-hour-usd must be positive, got {text}")
    BOUNDS["gpu_hour_usd"].check("--gpu-hour-usd", value)
    return value


def _batch_sizes(args: argparse.Namespace) -> list[int] | None:
    if args.batch_sizes is None:
        return None
    try:
        sizes = [int(part) for part in args.batch_sizes.split(",") if part.strip()]
    except ValueError:
        raise PlanInputError(f"--batch-sizes must be comma-separated integers, got {args.batch_sizes!r}") from None
    if not sizes or min(sizes) < 1:
        raise PlanInputError(f"--batch-sizes must be positive integers, got {args.batch_sizes!r}")
    for size in sizes:
        BOUNDS["batch_size"].check("--batch-sizes", size)
    return sizes


def render_table(result: Plan) -> str:
    """An aligned human table plus the knee and memory-limit lines."""
    hw, model = result.hardware, result.model
    per_sequence_gb = model.kv_bytes_per_sequence(result.context) / GB
    header = ("batch", "TPOT ms", "tok/s/user", "tok/s/node", "$/1M tok", "memory GB", "fits")
    lines = [
        (
            f"model:    {model.weight_bytes / GB:.1f} GB weights, {model.kv_bytes_per_token:,.0f} B KV/token "
            f"({per_sequence_gb:.2f} GB per {result.context:,}-token sequence)"
        ),
        (
            f"hardware: {hw.gpus} GPUs x {hw.hbm_bytes_per_gpu / GB:g} GB at "
            f"{hw.hbm_bandwidth_bytes_per_s_per_gpu / 1e12:g} TB/s = {hw.hbm_bytes / GB:g} GB, "
            f"{hw.bandwidth_bytes_per_s / 1e12:g} TB/s; ${hw.usd_per_hour:.2f}/h"
        ),
        "",
        " ".join(f"{title:>{width}}" for title, width in zip(header, _WIDTHS, strict=True)),
    ]
    for r in result.rows:
        usd = r.usd_per_mtok.quantize(Decimal("0.01"), ROUND_HALF_UP)
        lines.append(
            f"{r.batch_size:>6} {r.tpot_ms:>8.1f} {r.user_tokens_per_s:>11,.0f} {r.node_tokens_per_s:>11,.0f} "
            f"{usd:>9} {r.memory_gb:>10,.1f} {'yes' if r.fits else 'NO':>5}"
        )
    limit = (
        f"weights + KV cache fit in {hw.hbm_bytes / GB:g} GB"
        if result.max_batch_size
        else f"the weights alone need {model.weight_bytes / GB:.1f} GB of {hw.hbm_bytes / GB:g} GB"
    )
    lines += [
        "",
        f"knee batch size: {result.knee_batch_size} (KV reads equal weight reads; past it, batching buys latency)",
        f"max batch size:  {result.max_batch_size} ({limit})",
        "",
        (
            f"prefill (compute-bound): 2 x {model.parameter_count / 1e9:,.1f} GFLOP per prompt token at "
            f"{hw.gpus} x {hw.flops_per_s(model.weight_dtype) / hw.compute_efficiency / hw.gpus / 1e12:,.0f} "
            f"TFLOPS ({'FP8' if model.weight_dtype == 'fp8' else '16-bit'}, dense) x "
            f"{hw.compute_efficiency:g} efficiency = {result.prefill_tokens_per_s:,.0f} prompt tokens/s, "
            f"${result.usd_per_mtok_prefill.quantize(Decimal('0.001'), ROUND_HALF_UP)} per 1M prompt tokens"
        ),
    ]
    if result.job is not None:
        lines += ["", *render_job(result.job)]
    return "\n".join(lines)


def render_job(job: JobEstimate) -> list[str]:
    """The job's steady state: both clocks, its rates, how long it takes and what it costs."""
    usd = job.usd.quantize(Decimal("0.01"), ROUND_HALF_UP)
    per_mtok = job.usd_per_mtok.quantize(Decimal("0.001"), ROUND_HALF_UP)
    return [
        (
            f"job: {job.requests:,} requests x {job.prompt_tokens:,} prompt + {job.output_tokens:,} output tokens "
            f"(max_num_seqs {job.max_num_seqs:,}, {job.max_num_batched_tokens:,} tokens/step)"
        ),
        (
            f"  each step: {job.load.decode_seqs:,.0f} decodes + {job.load.prefill_tokens:,.0f} prompt tokens, "
            f"{job.bound}-bound, limited by the {job.limited_by}"
        ),
        f"  TTFT {job.ttft_seconds * 1e3:,.1f} ms (from its first chunk)  TPOT {job.step_seconds * 1e3:,.1f} ms",
        (
            f"  {job.requests_per_s:,.1f} requests/s, {job.prompt_tokens_per_s:,.0f} prompt + "
            f"{job.output_tokens_per_s:,.0f} output tokens/s"
        ),
        f"  {job.seconds:,.0f} s on one node, ${usd} (${per_mtok} per 1M tokens in + out)",
    ]
