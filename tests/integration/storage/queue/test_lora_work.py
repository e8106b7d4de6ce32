"""Admission weighs adapter lines' LoRA overhead (storage/planning/lora.py): the same tokens under an adapter are
more work than on the base, by the extra FLOPs of its rank on its target projections."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from storage import lifecycle
from storage.batches.admission import admission_check
from storage.clock import now
from storage.db import transaction
from storage.models import Adapter
from storage.planning.lora import adapter_factor
from storage.planning.shapes import work_of
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
