"""A tiny random-weight moderation classifier, built offline in about a second, for the demo and the tests.

A `LlamaForSequenceClassification` with OpenAI's 13 moderation categories as its labels and
`problem_type="multi_label_classification"` (each label's probability is its own sigmoid), on the demo model's
tokenizer. vLLM runs it with its pooling runner (`convert="classify"`); its scores are noise, but its
tokenizer, labels and shapes are real, so `/v1/moderations` lines run through vLLM exactly as they would on a
trained classifier.
"""

from __future__ import annotations

import json
from pathlib import Path

from worker.engine.demo_model import MAX_POSITIONS, SEED, VOCAB_SIZE, _train_tokenizer, build_offline

MARKER_FILE = "backfill-demo-moderation.json"
# OpenAI's moderation categories (openai.types.Moderation), in the order its answers list them.
MODERATION_CATEGORIES = (
    "harassment",
    "harassment/threatening",
    "hate",
    "hate/threatening",
    "illicit",
    "illicit/violent",
    "self-harm",
    "self-harm/intent",
    "self-harm/instructions",
    "sexual",
    "sexual/minors",
    "violence",
    "violence/graphic",
)


def build_demo_moderation_model(path: Path) -> Path:
    """Build the demo moderation model at `path` unless a complete one is already there; return `path`."""
    return build_offline(Path(path), marker=MARKER_FILE, write=_write_model)


def _write_model(folder: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForSequenceClassification

    tokenizer = _train_tokenizer()
    tokenizer.save_pretrained(folder)
    labels = dict(enumerate(MODERATION_CATEGORIES))
    config = LlamaConfig(  # type: ignore[call-arg]  # the labels are PretrainedConfig's keywords
        vocab_size=VOCAB_SIZE,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=False,
        dtype="bfloat16",
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        num_labels=len(labels),
        id2label=labels,
        label2id={label: index for index, label in labels.items()},
        problem_type="multi_label_classification",
    )
    torch.manual_seed(SEED)
    LlamaForSequenceClassification(config).bfloat16().save_pretrained(folder)  # type: ignore[no-untyped-call]
    facts = {"vocab_size": VOCAB_SIZE, "seed": SEED, "labels": list(MODERATION_CATEGORIES)}
    (folder / MARKER_FILE).write_text(json.dumps(facts, indent=2) + "\n")
