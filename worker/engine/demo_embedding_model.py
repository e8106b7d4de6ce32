"""A tiny random-weight Matryoshka embedding model (`backfill-demo-embed`), built offline in about a second, for the
demo and the tests: the shape of the lines written for OpenAI's text-embedding-3 models.

text-embedding-3 models are Matryoshka models: a line's `dimensions` keeps the first that many of the vector's
EMBEDDING_DIMENSIONS (1536, text-embedding-3-small's) and renormalises them. This one is a sentence-transformers
model as vLLM loads them: a tiny Llama (the demo model's tokenizer), mean pooling (`1_Pooling`), a Dense projection
to EMBEDDING_DIMENSIONS (`2_Dense`) and a normalisation (`3_Normalize`), its config marked `is_matryoshka` (vLLM's
ModelConfig.is_matryoshka), so vLLM honours `dimensions` from 1 to 1536 (it truncates, then normalises). Its
vectors are noise, but their size, norm and truncation are real.
"""

from __future__ import annotations

import json
from pathlib import Path

from worker.engine.demo_model import SEED, VOCAB_SIZE, _train_tokenizer, build_offline

MARKER_FILE = "backfill-demo-embed.json"
VERSION = 1
EMBEDDING_DIMENSIONS = 1536  # text-embedding-3-small's
MAX_POSITIONS = 8192  # text-embedding-3's input limit is 8191 tokens
HIDDEN_SIZE = 128

# sentence-transformers' module list: what vLLM reads for the pooling, the projection and the normalisation.
_MODULES = [
    {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
    {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"},
    {"idx": 3, "name": "3", "path": "3_Normalize", "type": "sentence_transformers.models.Normalize"},
]


def build_demo_embedding_model(path: Path) -> Path:
    """Build the Matryoshka embedding demo model at `path` unless a complete one of this VERSION is already there;
    return `path`."""
    return build_offline(Path(path), marker=MARKER_FILE, write=_write_model, version=VERSION)


def _write_model(folder: Path) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaModel

    tokenizer = _train_tokenizer()
    tokenizer.model_max_length = MAX_POSITIONS
    tokenizer.chat_template = None  # an embedding model embeds text as it is
    tokenizer.save_pretrained(folder)
    config = LlamaConfig(  # type: ignore[call-arg]  # is_matryoshka is a config attribute of its own
        vocab_size=VOCAB_SIZE,
        hidden_size=HIDDEN_SIZE,
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
        is_matryoshka=True,
    )
    torch.manual_seed(SEED)
    LlamaModel(config).bfloat16().save_pretrained(folder)
    (folder / "modules.json").write_text(json.dumps(_MODULES, indent=2) + "\n")
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": MAX_POSITIONS}) + "\n")
    for module in ("1_Pooling", "2_Dense", "3_Normalize"):
        (folder / module).mkdir()
    pooling = {"word_embedding_dimension": HIDDEN_SIZE, "pooling_mode_mean_tokens": True}
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling, indent=2) + "\n")
    dense = {
        "in_features": HIDDEN_SIZE,
        "out_features": EMBEDDING_DIMENSIONS,
        "bias": True,
        "activation_function": "torch.nn.modules.linear.Identity",
    }
    (folder / "2_Dense" / "config.json").write_text(json.dumps(dense, indent=2) + "\n")
    projection = torch.nn.Linear(HIDDEN_SIZE, EMBEDDING_DIMENSIONS)
    weights = {"linear.weight": projection.weight.detach().clone(), "linear.bias": projection.bias.detach().clone()}
    save_file(weights, folder / "2_Dense" / "model.safetensors", metadata={"format": "pt"})
    facts = {"version": VERSION, "vocab_size": VOCAB_SIZE, "seed": SEED, "dimensions": EMBEDDING_DIMENSIONS}
    (folder / MARKER_FILE).write_text(json.dumps(facts, indent=2) + "\n")
