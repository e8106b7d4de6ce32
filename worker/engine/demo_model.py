"""A tiny random-weight Llama chat model, built offline in about a second, for the demo and the tests.

Its output text is noise, but its tokenizer, chat template, token counts and shapes are real, so vLLM
loads and batches it exactly like a production model.
"""

from __future__ import annotations

import json
import os
import shutil
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path

MARKER_FILE = "backfill-demo.json"
SEED = 0
VOCAB_SIZE = 4096
MAX_POSITIONS = 2048
TRAINING_TEXT_BYTES = 1_500_000  # about one second of BPE training

BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"
ROLE_TOKENS = ["<|system|>", "<|user|>", "<|assistant|>", "<|tool|>"]
SPECIAL_TOKENS = [PAD, BOS, EOS, *ROLE_TOKENS]

# Role-tagged turns, each closed by EOS; the model answers after "<|assistant|>\n".
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + eos_token + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)


def build_demo_model(path: Path) -> Path:
    """Build the demo model at `path` unless a complete one is already there; return `path`."""
    path = Path(path)
    if (path / MARKER_FILE).is_file():
        return path
    if path.is_dir() and any(path.iterdir()):
        raise RuntimeError(f"{path} exists and is not a Backfill demo model (no {MARKER_FILE}); remove it")
    path.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename: a crash leaves only a hidden temp dir, never half a model.
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=path.parent))
    try:
        _write_model(staging)
        staging.chmod(0o755)  # mkdtemp makes it private; the model is not a secret
        if path.is_dir():
            path.rmdir()  # empty, checked above
        os.rename(staging, path)
    except OSError:
        if not (path / MARKER_FILE).is_file():  # not a concurrent builder winning the race
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return path


def _write_model(folder: Path) -> None:
    tokenizer = _train_tokenizer()
    tokenizer.save_pretrained(folder)
    _write_weights(folder, tokenizer)
    facts = {"vocab_size": VOCAB_SIZE, "seed": SEED, "eos_token": EOS}
    (folder / MARKER_FILE).write_text(json.dumps(facts, indent=2) + "\n")


def _training_text() -> Iterator[str]:
    """The standard library's own modules, in a fixed order, up to TRAINING_TEXT_BYTES."""
    budget = TRAINING_TEXT_BYTES
    for source in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        text = source.read_text(encoding="utf-8", errors="replace")
        yield text[:budget]
        budget -= len(text)
        if budget <= 0:
            return


def _train_tokenizer(extra_special_tokens: tuple[str, ...] = ()):  # type: ignore[no-untyped-def]
    """The demo models' byte-level BPE tokenizer (`extra_special_tokens`: more single-token markers, e.g. an
    image placeholder for a vision-language demo model)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[*SPECIAL_TOKENS, *extra_special_tokens],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(_training_text(), trainer=trainer)
    bos_id = core.token_to_id(BOS)
    # Plain prompts get a BOS like Llama's; chat prompts get theirs from the template instead.
    core.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=[*ROLE_TOKENS, *extra_special_tokens],
        model_max_length=MAX_POSITIONS,
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
    )


def _write_weights(folder: Path, tokenizer) -> None:  # type: ignore[no-untyped-def]
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    ids = {
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=True,
        dtype="bfloat16",
        **ids,
    )
    torch.manual_seed(SEED)
    LlamaForCausalLM(config).bfloat16().save_pretrained(folder)
    GenerationConfig(**{**ids, "eos_token_id": [tokenizer.eos_token_id]}).save_pretrained(folder)
