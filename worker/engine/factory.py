"""The engine factory: the one place that turns a served model's spec into an Engine (and the only path to vLLM).

Adapters are imported only when chosen, so a process that never runs vLLM never imports torch.
"""

from __future__ import annotations

from storage.settings import Settings
from worker.engine import Engine, timed_fake


def load_engine(settings: Settings, model: str) -> Engine:
    """Build the engine for `model` from the registry (the only path to vLLM)."""
    spec = settings.served_models()[model]
    if spec.path == timed_fake.PATH:  # the fake timed like the target GPU (benchmarks)
        return timed_fake.from_spec(model, spec)
    if spec.path.startswith("fake:"):
        from worker.engine.decode_ledger import ledger_from_extra
        from worker.engine.fake import FakeEngine

        return FakeEngine(
            model_name=model,
            max_num_seqs=spec.resolved_max_num_seqs(),
            runner=spec.runner,
            task=spec.task,
            max_model_len=spec.max_model_len or 2048,
            step_seconds=float(spec.extra.get("step_seconds", 0.0)),
            ledger=ledger_from_extra(spec.extra, model=model),  # tests and benchmarks only
            tool_parser=spec.tool_parser,
            reasoning_parser=spec.reasoning_parser,
        )
    if spec.shared is not None:  # shared mode: a vLLM server that also serves online users
        from worker.engine.http_engine import HttpEngine

        return HttpEngine(model, spec)
    from worker.engine.vllm_engine import VllmEngine

    return VllmEngine(model, spec)
