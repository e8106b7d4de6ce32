"""Admission weighs adapter lines' LoRA overhead (storage/planning/lora.py): the same tokens under an adapter are
more work than on the base, by the extra FLOPs of its rank on its target projections."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from storage import lifecycle
from storage.batches.admission import admission_check
from storage.batches.estimates import estimate_job
from storage.clock import now
from storage.db import transaction
from storage.models import Adapter
from storage.planning.lora import adapter_factor
from storage.planning.shapes import shape_of_jsonl, work_of
from storage.queue.backlog import open_jobs, with_lora_work
from storage.settings import get_settings
from tests.conftest import Backend
from tests.factories import make_batch, make_request, make_tenant
from worker.engine.demo_adapter import DEMO_SHAPES

# The demo model's shapes (a tiny base: a rank-64 adapter on every projection is a large share of its FLOPs).
BASE = Path(tempfile.mkdtemp(prefix="backfill-test-lora-base-"))
(BASE / "config.json").write_text(
    json.dumps({"hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 4, "num_attention_heads": 4,
                "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 4096, "tie_word_embeddings": True})
)  # fmt: skip
MODELS = {
    "llama": {"path": str(BASE), "enable_lora": True, "max_lora_rank": 64},
    "plain": {"path": "fake:"},
}
pytestmark = pytest.mark.backfill_env({"BACKFILL_MODELS": json.dumps(MODELS), "BACKFILL_ADMISSION_POLICY": "warn"})


def test_adapter_lines_weigh_their_lora_flops_in_admission(backend: Backend) -> None:
    settings = get_settings()
    with transaction() as session:
        tenant = make_tenant(session)
        session.add(
            Adapter(id="adapter_1", name="wide", base_model="llama", tenant_id=None, path="/nowhere", rank=64,
                    size_bytes=1, target_modules=list(DEMO_SHAPES), created_at=now())
        )  # fmt: skip
        batches = {}
        for adapter in (None, "wide", "gone"):  # the base; a rank-64 adapter; one deleted since
            batch = make_batch(session, tenant=tenant, model="llama", created_at=now())
            for _ in range(10):
                row = make_request(session, batch=batch, status=lifecycle.REQ_QUEUED, max_tokens=100)
                row.adapter = adapter
            batches[adapter] = batch.id
    with transaction() as session:
        jobs = {job.batch_id: job for job in with_lora_work(session, settings, model="llama",
                                                             jobs=open_jobs(session, model="llama"))}  # fmt: skip
        base_work = work_of(jobs[batches[None]].shape, settings.prefill_weight)
        factor = adapter_factor(str(BASE), rank=64, targets=list(DEMO_SHAPES))
        assert 1.25 < factor < 1.35  # 2 x 64 x (d_in + d_out) on 7 projections x 4 layers vs 2 x 4.2 M parameters
        assert work_of(jobs[batches["wide"]].shape, settings.prefill_weight) == pytest.approx(base_work * factor)
        assert work_of(jobs[batches["gone"]].shape, settings.prefill_weight) == base_work  # nothing to model

        at = float(now())
        base_only = admission_check(session, batch_id=batches[None], model="llama", settings=settings, at=at,
                                    jobs=[jobs[batches[None]]])  # fmt: skip
        wide_only = admission_check(session, batch_id=batches["wide"], model="llama", settings=settings, at=at,
                                    jobs=[jobs[batches["wide"]]])  # fmt: skip
        assert wide_only.finish_at - at == pytest.approx((base_only.finish_at - at) * factor)


def test_a_model_without_adapters_is_unchanged(backend: Backend) -> None:
    with transaction() as session:
        batch = make_batch(session, tenant=make_tenant(session), model="plain", created_at=now())
        make_request(session, batch=batch, status=lifecycle.REQ_QUEUED)
    with transaction() as session:
        jobs = open_jobs(session, model="plain")
        assert with_lora_work(session, get_settings(), model="plain", jobs=jobs) is jobs


def _file(model: str, count: int) -> list[bytes]:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 100}
    return [
        b"".join(
            json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}).encode()
            + b"\n"
            for i in range(count)
        )
    ]


def test_an_estimate_weighs_queued_and_its_own_adapter_lines_as_admission_does(backend: Backend) -> None:
    settings = get_settings()
    with transaction() as session:
        tenant = make_tenant(session)
        session.add(
            Adapter(id="adapter_1", name="wide", base_model="llama", tenant_id=None, path="/nowhere", rank=64,
                    size_bytes=1, target_modules=list(DEMO_SHAPES), created_at=now())
        )  # fmt: skip
        for adapter in (None, "wide"):
            batch = make_batch(session, tenant=tenant, model="llama", created_at=now())
            for _ in range(10):
                row = make_request(session, batch=batch, status=lifecycle.REQ_QUEUED, max_tokens=100)
                row.adapter = adapter
    factor = adapter_factor(str(BASE), rank=64, targets=list(DEMO_SHAPES))
    with transaction() as session:
        weighed = with_lora_work(session, settings, model="llama", jobs=open_jobs(session, model="llama"))
        queued_work = sum(work_of(job.shape, settings.prefill_weight) for job in weighed)
        sized = {
            model: shape_of_jsonl(_file(model, 5), max_line_bytes=10_000, max_requests=100, adapters={"wide": "llama"})
            for model in ("llama", "wide")
        }
        base, tuned = (
            estimate_job(session, model="llama", shape=sized[m], settings=settings) for m in ("llama", "wide")
        )
    rate = base.throughput.work_per_second
    assert base.backlog_seconds == pytest.approx(queued_work / rate)  # the queued "wide" lines weigh their factor
    assert tuned.job_seconds == pytest.approx(factor * work_of(sized["wide"], settings.prefill_weight) / rate)
    assert base.job_seconds == pytest.approx(work_of(sized["llama"], settings.prefill_weight) / rate)
    assert tuned.job.lora_work > 0 and base.job.lora_work == 0
