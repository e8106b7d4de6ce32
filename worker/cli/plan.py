"""`backfill plan`: the roofline table for a model on a node, from a few numbers or a config.json."""

from __future__ import annotations

import argparse
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
    ModelShape,
    Plan,
    plan,
)

DEFAULT_HARDWARE = "8xH100-SXM"
_WIDTHS = (6, 8, 11, 11, 9, 10, 5)


class PlanInputError(ValueError):
    """Bad command-line input; reported as one line on stderr with exit code 2."""


def register(subparsers: Any) -> None:
    """Add the `plan` subcommand to the CLI's subparsers."""
    parser = subparsers.add_parser(
        "plan",
        help="roofline cost per token and latency by batch size",
        description="Decode-step roofline: TPOT, tokens/s and $ per 1M tokens at each batch size.",
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
    parser.add_argument("--context", type=int, default=4096, help="tokens per sequence (default 4096)")
    parser.add_argument("--batch-sizes", help="comma-separated, e.g. 1,8,32 (default: powers of 2, knee, max)")
    parser.add_argument("--format", choices=["table", "json"], default="table")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print the plan; 2 with a one-line error on bad input."""
    try:
        result = plan(_model(args), _hardware(args), _positive("--context", args.context), _batch_sizes(args))
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
    return Hardware(
        gpus=_positive("--gpus", args.gpus) or base.gpus,
        hbm_bytes_per_gpu=hbm_gb * GB if hbm_gb else base.hbm_bytes_per_gpu,
        hbm_bandwidth_bytes_per_s_per_gpu=hbm_tbps * 1e12 if hbm_tbps else base.hbm_bandwidth_bytes_per_s_per_gpu,
        usd_per_gpu_hour=_usd(args.gpu_hour_usd) if args.gpu_hour_usd is not None else base.usd_per_gpu_hour,
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
    ]
    return "\n".join(lines)
