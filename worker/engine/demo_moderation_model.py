"""A tiny random-weight moderation classifier of text and images, built offline in a few seconds, for the demo and
the tests.

Like OpenAI's omni-moderation it is one model for text and images: an Idefics3 (the vision-language demo model's
architecture, worker/engine/demo_vl_model.py: a SigLIP-like vision tower, a pixel shuffle, a tiny Llama) with a
classification head over OpenAI's 13 moderation categories as its labels and
`problem_type="multi_label_classification"` (each label's probability is its own sigmoid). vLLM runs it with its
pooling runner (`convert="classify"`, which reads the head's `score.weight`); a text input is classified as it is,
an input with images as one user turn of its chat template (the images expanded by vLLM's multimodal processor).
Its scores are noise, but its tokenizer, image processor, labels and shapes are real, so `/v1/moderations` lines
run through vLLM exactly as they would on a trained classifier.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from worker.engine.demo_model import SEED, VOCAB_SIZE, build_offline
from worker.engine.wire.openai.moderations import CATEGORIES

MARKER_FILE = "backfill-demo-moderation.json"
VERSION = 2  # 2: images (an Idefics3 classifier, was a text-only Llama one) and a 32k context
MODERATION_CATEGORIES = CATEGORIES  # its labels: OpenAI's categories, in the order its answers list them
TEXT_SHAPE: dict[str, Any] = {  # smaller than the demo model's: it only reads
    "hidden_size": 128,
    "intermediate_size": 384,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 64,
}


def build_demo_moderation_model(path: Path) -> Path:
    """Build the demo moderation model at `path` unless a complete one of this VERSION is already there; return
    `path`."""
    return build_offline(Path(path), marker=MARKER_FILE, write=_write_model, version=VERSION)


def _write_model(folder: Path) -> None:
    from worker.engine.demo_vl_model import write_idefics3

    write_idefics3(folder, text_shape=TEXT_SHAPE, labels=MODERATION_CATEGORIES)
    facts = {"version": VERSION, "vocab_size": VOCAB_SIZE, "seed": SEED, "labels": list(MODERATION_CATEGORIES)}
    (folder / MARKER_FILE).write_text(json.dumps(facts, indent=2) + "\n")
