"""A tiny random-weight vision-language model (`backfill-demo-vl`), built offline in a few seconds, for the demo and
the tests: Idefics3 (SmolVLM's architecture: a SigLIP-like vision tower, a pixel shuffle, a tiny Llama).

Idefics3 is the vision-language architecture vLLM runs on these CPUs with no torchvision (LLaVA and Qwen2-VL import
it; /work/scratch-vl research, docs/images.md). Its tokenizer is the demo model's (`demo_model._train_tokenizer`)
with Idefics3's image markers as single tokens, its chat template renders OpenAI-style content parts (text and
images), and its image processor resizes every image to IMAGE_SIZE px (no splitting), so each image is
IMAGE_SEQ_LEN image tokens between three markers: IMAGE_PROMPT_TOKENS prompt tokens per image. Its answers are
noise, but vLLM loads, processes and batches it exactly like a production vision-language model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from worker.engine.demo_model import MAX_POSITIONS, build_offline

MARKER_FILE = "backfill-demo-vl.json"
VERSION = 2  # 2: a 32k context (a model of an older version is rebuilt)
SEED = 0
IMAGE_SIZE = 32  # px: every image is resized to this square
PATCH_SIZE = 8
SCALE_FACTOR = 2  # the pixel shuffle: (IMAGE_SIZE / PATCH_SIZE)^2 patches become this^2 times fewer tokens
IMAGE_SEQ_LEN = (IMAGE_SIZE // PATCH_SIZE) ** 2 // SCALE_FACTOR**2
# <fake_token_around_image> <global-img> <image> x IMAGE_SEQ_LEN <fake_token_around_image>
IMAGE_PROMPT_TOKENS = IMAGE_SEQ_LEN + 3

IMAGE, AROUND, GLOBAL = "<image>", "<fake_token_around_image>", "<global-img>"
# Idefics3's processor names row/column tokens for split images (unused here: no splitting) and an end of utterance.
_EXTRA_TOKENS = (
    IMAGE,
    AROUND,
    GLOBAL,
    "<end_of_utterance>",
    *(f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)),
)

# Role-tagged turns closed by EOS, as the demo model's; a message's content is a string or a list of parts, an image
# part becoming the `<image>` placeholder the processor expands.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}{{ '<image>\n' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ eos_token + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)


# The text model's shape: the demo model's (worker/engine/demo_model.py).
TEXT_SHAPE: dict[str, Any] = {
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
}


def build_demo_vl_model(path: Path) -> Path:
    """Build the vision-language demo model at `path` unless a complete one of this VERSION is already there;
    return `path`."""
    return build_offline(Path(path), marker=MARKER_FILE, write=_write_model, version=VERSION)


def _write_model(folder: Path) -> None:
    write_idefics3(folder, text_shape=TEXT_SHAPE)
    facts = {"version": VERSION, "seed": SEED, "image_size": IMAGE_SIZE, "image_prompt_tokens": IMAGE_PROMPT_TOKENS}
    (folder / MARKER_FILE).write_text(json.dumps(facts, indent=2) + "\n")


def write_idefics3(folder: Path, *, text_shape: dict[str, Any], labels: tuple[str, ...] = ()) -> None:
    """A random-weight Idefics3 with its tokenizer, image processor and chat template in `folder`; with `labels`, a
    multi-label classifier of them (vLLM's `convert="classify"` reads its `score.weight`, one row per label, and
    its top-level config's `id2label`), else a generating model."""
    import torch
    from tokenizers import processors
    from transformers import (
        GenerationConfig,
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3Processor,
        LlamaConfig,
    )
    from transformers.models.idefics3.configuration_idefics3 import Idefics3VisionConfig
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    from worker.engine.demo_model import VOCAB_SIZE, _train_tokenizer

    tokenizer = _train_tokenizer(extra_special_tokens=_EXTRA_TOKENS)
    # vLLM tokenizes a multimodal model's chat prompt with special tokens (as its Hugging Face processor does) and
    # the template writes BOS itself: a tokenizer adding BOS too would start every chat with two.
    tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(single="$A", pair="$A $B")
    tokenizer.chat_template = CHAT_TEMPLATE
    ids = {
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    vision = Idefics3VisionConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=IMAGE_SIZE,
        patch_size=PATCH_SIZE,
    )
    config = Idefics3Config(
        vision_config=vision.to_dict(),
        text_config=LlamaConfig(
            vocab_size=VOCAB_SIZE,
            max_position_embeddings=MAX_POSITIONS,
            tie_word_embeddings=True,
            **text_shape,
            **ids,
        ).to_dict(),
        image_token_id=tokenizer.convert_tokens_to_ids(IMAGE),
        scale_factor=SCALE_FACTOR,
        tie_word_embeddings=True,
        **ids,
    )
    config.dtype = "bfloat16"
    if labels:
        config.id2label = dict(enumerate(labels))
        config.label2id = {label: index for index, label in enumerate(labels)}
        config.problem_type = "multi_label_classification"
    torch.manual_seed(SEED)
    model = Idefics3ForConditionalGeneration(config).bfloat16()  # type: ignore[no-untyped-call]
    model.save_pretrained(folder)
    if labels:  # Transformers has no Idefics3 classifier: the head is written beside the weights it saved
        from safetensors.torch import load_file, save_file

        weights = load_file(folder / "model.safetensors")
        weights["score.weight"] = (torch.randn(len(labels), text_shape["hidden_size"]) * 0.5).bfloat16()
        save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    size = {"longest_edge": IMAGE_SIZE}
    images = Idefics3ImageProcessorPil(do_image_splitting=False, size=size, max_image_size=size)
    processor = Idefics3Processor(
        image_processor=images, tokenizer=tokenizer, image_seq_len=IMAGE_SEQ_LEN, chat_template=CHAT_TEMPLATE
    )
    processor.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    if not labels:
        GenerationConfig(**{**ids, "eos_token_id": [tokenizer.eos_token_id]}).save_pretrained(folder)  # type: ignore[no-untyped-call]
