"""The corpus of real batch lines (tests/data/corpus/: gathered from public repositories and vendors' docs, each
line citing its source) end to end on the embedded default: `backfill serve` with nothing configured but its data
folder, the real engines on the demo models, the official `openai` and `anthropic` SDKs.

By default a smoke subset runs (`SMOKE`: text, tools, structured output and reasoning lines of both protocols) on the
embedded default's text demo model alone (its registry entry as BACKFILL_MODELS: one engine to start). The whole
corpus: `make corpus`, i.e. `BACKFILL_CORPUS=all pytest -s tests/e2e/test_corpus.py`, which prints the pass counts
per protocol and per feature and every failing line with its reason, and asserts that at least 95% of the lines
succeed and that every failing line is one its vendor refuses too (the line's `vendor_refuses` in the corpus says
why). tests/data/corpus/SOURCES.md lists the sources and the only
two changes made to a line when it runs (its model, its remote image URLs: tests/e2e/corpus.py).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anthropic
import pytest

from storage.registry import DEFAULT_EMBEDDING_MODEL
from tests.conftest import LiveServer, configure, make_key, start_server
from tests.e2e import corpus, corpus_runs

pytestmark = pytest.mark.vllm

FULL = os.environ.get("BACKFILL_CORPUS", "") == "all"
REPORT = os.environ.get("BACKFILL_CORPUS_REPORT")  # a path: each line's outcome as JSON (read here: the fixture
# clears BACKFILL_* variables)
PASS_SHARE = 0.95
# The smoke subset: text-model lines only (no other engine's start-up), few output tokens where lines bound them:
# text, structured output, reasoning, Responses, a forced tool, system and multi-turn.
SMOKE = {
    "openai": ("request-1", "request-0", "chat_4", "request-1-response"),
    "anthropic": ("my-first-request", "system-prompt", "multi-turn", "request-0"),
}


def _chosen(protocol: str) -> list[corpus.Entry]:
    entries = corpus.load(protocol)
    if FULL:
        return entries
    wanted = SMOKE[protocol]
    picked: dict[str, corpus.Entry] = {}
    for entry in entries:
        multimodal = any(f.startswith(("image", "document")) for f in corpus.features(entry))
        if entry.custom_id in wanted and entry.custom_id not in picked and not multimodal:
            if protocol == "openai" and corpus.endpoint(entry) not in {"/v1/chat/completions", "/v1/responses"}:
                continue
            picked[entry.custom_id] = entry
    return list(picked.values())


@pytest.fixture(scope="module")
def live(demo_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """`backfill serve` as a newcomer runs it (the demo models built as `serve` builds them); remote images allowed
    from 127.0.0.1 only, where the test serves the stand-in image."""
    from storage.settings import Settings, get_settings
    from worker.cli.migrate import migrate_database
    from worker.process import service

    data = tmp_path_factory.mktemp("corpus")
    (data / "models").mkdir()
    (data / "models" / "backfill-demo").symlink_to(demo_model_path)
    env = {"BACKFILL_DATA_DIR": str(data), "BACKFILL_REAP_INTERVAL_SECONDS": "1"}
    for name in Settings.model_fields:  # the fetch rules for remote images: webhooks' (or the media's own) settings
        if name.endswith("allow_http"):
            env[f"BACKFILL_{name.upper()}"] = "true"
        elif name.endswith("allowed_networks"):
            env[f"BACKFILL_{name.upper()}"] = "127.0.0.1/32"
    service.close_engines()  # engines are cached per model name: other modules' specs must not leak in
    with pytest.MonkeyPatch.context() as patch:
        configure(patch, env)
        served = get_settings().served_models()
        if not FULL:  # the smoke subset needs the text demo model only: no other engine's start-up
            only = {"backfill-demo": served["backfill-demo"].model_dump(exclude_defaults=True)}
            configure(patch, {**env, "BACKFILL_MODELS": json.dumps(only)})
            served = get_settings().served_models()
        _build_demo_models(served)
        migrate_database()
        server, stop = start_server(with_worker=True)
        try:
            assert server.worker is not None and server.worker.ready.wait(600)  # type: ignore[attr-defined]
            yield server
        finally:
            stop()
            service.close_engines()


def _build_demo_models(served: dict[str, Any]) -> None:
    """What `backfill serve` builds on first start, and the other demo models the registry names."""
    from worker.cli.serve import ensure_demo_model

    ensure_demo_model()
    builders = {"-vl": "worker.engine.demo_vl_model:build_demo_vl_model"}
    builders["moderation"] = "worker.engine.demo_moderation_model:build_demo_moderation_model"
    builders["-embed"] = "worker.engine.demo_embedding_model:build_demo_embedding_model"
    for name, spec in served.items():
        for marker, target in builders.items():
            if marker in name and not Path(spec.path).exists():
                module, function = target.split(":")
                getattr(__import__(module, fromlist=[function]), function)(Path(spec.path))


def by_protocol(outcomes: list[corpus.Outcome], protocol: str) -> list[corpus.Outcome]:
    return [o for o in outcomes if o.entry.protocol == protocol]


def test_the_corpus_runs_end_to_end(live: LiveServer) -> None:
    key = make_key("corpus")
    openai_client = live.client(key)
    anthropic_client = anthropic.Anthropic(api_key=key, base_url=live.base_url, max_retries=0, timeout=120)
    served = corpus.ServedModels.from_names(
        [m.id for m in openai_client.models.list()], embedding=DEFAULT_EMBEDDING_MODEL
    )
    images = corpus.ImageServer()
    outcomes, requests = [], {}
    try:
        for protocol in corpus.PROTOCOLS:
            for entry in _chosen(protocol):
                request, notes = corpus.mapped_request(entry, served, images.url)
                requests[entry.name] = request
                outcomes.append(corpus.Outcome(entry, corpus.features(entry), notes))
        timeout = 2400 if FULL else 240  # real lines ask up to 16,000 tokens of a model that never stops early
        # both protocols' batches at once: the engine packs them, as it would any two clients' work
        with ThreadPoolExecutor(max_workers=2) as pool:
            runs = [
                pool.submit(corpus_runs.run_openai, openai_client, by_protocol(outcomes, "openai"), requests, timeout),
                pool.submit(
                    corpus_runs.run_anthropic, anthropic_client, by_protocol(outcomes, "anthropic"), requests, timeout
                ),
            ]
            for run in runs:
                run.result()
    finally:
        images.close()

    print(f"\nserved models: {served}")
    print(corpus.table(outcomes))
    print("failing lines:\n" + corpus.failures(outcomes))
    if REPORT:
        rows = [
            {
                "line": o.entry.name,
                "custom_id": o.entry.custom_id,
                "features": o.features,
                "ok": o.ok,
                "error": o.error,
                "mapped": o.mapped,
                "vendor_refuses": o.entry.vendor_refuses,
            }
            for o in outcomes
        ]
        Path(REPORT).write_text(json.dumps(rows, indent=1))

    passed = sum(o.ok for o in outcomes)
    unexplained = [o for o in outcomes if not o.ok and not o.entry.vendor_refuses]
    assert passed >= PASS_SHARE * len(outcomes), f"{passed} of {len(outcomes)} lines succeeded"
    assert not unexplained, "failing lines their vendor accepts:\n" + corpus.failures(unexplained)
