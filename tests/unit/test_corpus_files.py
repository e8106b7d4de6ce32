"""The corpus of real batch lines (tests/data/corpus/): every line cites its source, and running a line changes only
its model and its remote image URLs (tests/e2e/corpus.py)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e import corpus, corpus_runs

MODELS = corpus.ServedModels(
    chat="backfill-demo",
    vision="backfill-demo-vl",
    embedding="minilm",
    moderation="backfill-demo-moderation",
    matryoshka="backfill-demo-embed",
)
IMAGE = "http://127.0.0.1:1/corpus-image.png"


def _strip(value: Any) -> Any:
    """The line without what a run may change: models and http(s) URLs."""
    if isinstance(value, dict):
        return {
            k: _strip(v)
            for k, v in value.items()
            if k != "model" and not (k in {"url", "image_url"} and str(v).startswith(("http://", "https://")))
        }
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


@pytest.mark.parametrize("protocol", corpus.PROTOCOLS)
def test_every_line_cites_its_source_and_is_a_batch_line_of_its_protocol(protocol: str) -> None:
    entries = corpus.load(protocol)
    assert entries
    for entry in entries:
        source = entry.source
        assert source.get("url") or (source.get("repo") and source.get("path")), entry.name
        assert entry.how, entry.name
        if protocol == "openai":
            assert set(entry.request) == {"custom_id", "method", "url", "body"}, entry.name
            assert entry.request["method"] == "POST" and corpus.endpoint(entry) in corpus.OPENAI_ENDPOINTS
        else:
            assert set(entry.request) == {"custom_id", "params"}, entry.name


@pytest.mark.parametrize("protocol", corpus.PROTOCOLS)
def test_a_run_changes_only_the_model_and_remote_image_urls(protocol: str) -> None:
    for entry in corpus.load(protocol):
        request, notes = corpus.mapped_request(entry, MODELS, IMAGE)
        assert _strip(request) == _strip(entry.request), entry.name
        body = request["body"] if protocol == "openai" else request["params"]
        assert body.get("model") == corpus.served_model(entry, MODELS), entry.name
        assert IMAGE not in str(entry.request) and "https://" not in str(_image_urls(request)), entry.name
        assert len(notes) == (body.get("model") != _model(entry)) + str(request).count(IMAGE), entry.name


def test_text_embedding_3_lines_meet_the_matryoshka_model_and_other_embedding_lines_the_embedding_model() -> None:
    served = {
        str(entry.request["body"]["model"]): corpus.served_model(entry, MODELS)
        for entry in corpus.load("openai")
        if corpus.endpoint(entry) == "/v1/embeddings"
    }
    assert served["text-embedding-3-small"] == "backfill-demo-embed"
    assert served["intfloat/e5-mistral-7b-instruct"] == "minilm"
    without = corpus.ServedModels.from_names(["backfill-demo", "minilm"], embedding="minilm")
    assert without.matryoshka is None  # a server without one: text-embedding-3 lines meet the embedding model


def test_lines_are_grouped_without_two_custom_ids_alike_in_one_batch() -> None:
    entries = corpus.load("anthropic")
    groups = corpus_runs.groups(entries, key=lambda e: "all")
    assert sum(map(len, groups)) == len(entries)
    for group in groups:
        assert len({e.custom_id for e in group}) == len(group)


def _model(entry: corpus.Entry) -> Any:
    return (entry.request.get("body") or entry.request.get("params") or {}).get("model")


def _image_urls(request: dict[str, Any]) -> list[str]:
    found = []
    for node in corpus._walk(request.get("body") or request.get("params")):
        if isinstance(node, dict):
            found += [str(node[k]) for k in ("url", "image_url") if isinstance(node.get(k), str)]
    return found
