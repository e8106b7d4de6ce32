"""A tiny random-weight Llama chat model, built offline in about a second, for the demo and the tests.

Its output text is noise, but its tokenizer, chat template, token counts and shapes are real, so vLLM
loads and batches it exactly like a production model. Like a Qwen3 or Hermes model it has `<think>`, `</think>`,
`<tool_call>` and `</tool_call>` as single (not special) tokens, and its chat template renders tools, the calls an
assistant made and tool results, and turns thinking on (`enable_thinking`, or a `reasoning_effort` other than
"none") or off (the default: an empty thinking block, so a structured output's grammar starts at once), so vLLM's
"hermes" tool parser and "deepseek_r1" reasoning parser run on it (the embedded default's registry entry).
"""

from __future__ import annotations

import json
import os
import shutil
import sysconfig
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

MARKER_FILE = "backfill-demo.json"
# 2: thinking and tool-call tokens and template; 3: a 32k context (a model of an older version is rebuilt)
VERSION = 3
SEED = 0
VOCAB_SIZE = 4096
# The demo models' context, as long as the models real lines are written for (olmocr asks 6000 output tokens of a
# page image, a thinking line a 14000-token budget inside max_tokens 16000).
MAX_POSITIONS = 32768
TRAINING_TEXT_BYTES = 1_500_000  # about one second of BPE training

BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"
ROLE_TOKENS = ["<|system|>", "<|user|>", "<|assistant|>", "<|tool|>"]
SPECIAL_TOKENS = [PAD, BOS, EOS, *ROLE_TOKENS]
MARKER_TOKENS = ("<think>", "</think>", "<tool_call>", "</tool_call>")  # single tokens, kept in decoded text

# Role-tagged turns, each closed by EOS; the model answers after "<|assistant|>\n" and a thinking block: open
# when thinking is on, empty when off. Tools lead as a system turn of JSON schemas; calls are Hermes' format.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% if tools %}{{ '<|system|>\nYou may call these tools:\n' }}"
    "{% for tool in tools %}{{ tool | tojson }}{{ '\n' }}{% endfor %}"
    '{{ \'To call one, answer <tool_call>{"name": <its name>, "arguments": <an object>}</tool_call>\' }}'
    "{{ eos_token + '\n' }}{% endif %}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' + (message['content'] or '') }}"
    "{% if message['tool_calls'] %}{% for call in message['tool_calls'] %}"
    "{{ '<tool_call>' }}{{ {'name': call['function']['name'], 'arguments': call['function']['arguments']} | tojson }}"
    "{{ '</tool_call>' }}{% endfor %}{% endif %}"
    "{{ eos_token + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}"
    "{% if enable_thinking is defined and enable_thinking or enable_thinking is not defined and reasoning_effort "
    "is defined and reasoning_effort and reasoning_effort != 'none' %}{{ '<think>\n' }}"
    "{% else %}{{ '<think>\n\n</think>\n\n' }}{% endif %}{% endif %}"
)


def build_demo_model(path: Path) -> Path:
    """Build the demo model at `path` unless a complete one of this VERSION is already there; return `path`."""
    return build_offline(Path(path), marker=MARKER_FILE, write=_write_model, version=VERSION)


def _retire_outdated(path: Path, *, marker: str = MARKER_FILE, version: int = VERSION) -> None:
    """A demo model an older Backfill built (its `marker` file names an older `version`, or none): moved aside and
    removed, so it is built again."""
    try:
        facts = json.loads((path / marker).read_text())
    except (OSError, ValueError):
        return
    if facts.get("version", 1) >= version:
        return
    retired = path.with_name(f".{path.name}-v{facts.get('version', 1)}-{os.getpid()}")
    try:
        os.rename(path, retired)
    except OSError:  # a concurrent builder moved it first
        return
    shutil.rmtree(retired, ignore_errors=True)


def build_offline(path: Path, *, marker: str, write: Callable[[Path], None], version: int = 1) -> Path:
    """Build a demo model at `path` with `write` (which ends by writing `marker` with this `version`), unless a
    complete one of this version (its `marker` file) is already there; return `path`."""
    _retire_outdated(path, marker=marker, version=version)
    if (path / marker).is_file():
        return path
    if path.is_dir() and any(path.iterdir()):
        raise RuntimeError(f"{path} exists and is not a Backfill demo model (no {marker}); remove it")
    path.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename: a crash leaves only a hidden temp dir, never half a model.
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=path.parent))
    try:
        write(staging)
        staging.chmod(0o755)  # mkdtemp makes it private; the model is not a secret
        if path.is_dir():
            path.rmdir()  # empty, checked above
        os.rename(staging, path)
    except OSError:
        if not (path / marker).is_file():  # not a concurrent builder winning the race
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return path


def _write_model(folder: Path) -> None:
    tokenizer = _train_tokenizer(extra_tokens=MARKER_TOKENS)
    tokenizer.save_pretrained(folder)
    _write_weights(folder, tokenizer)
    facts = {"version": VERSION, "vocab_size": VOCAB_SIZE, "seed": SEED, "eos_token": EOS}
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


def _train_tokenizer(  # type: ignore[no-untyped-def]
    extra_special_tokens: tuple[str, ...] = (), extra_tokens: tuple[str, ...] = ()
):
    """The demo models' byte-level BPE tokenizer (`extra_special_tokens`: more single-token markers, e.g. an
    image placeholder for a vision-language demo model; `extra_tokens`: single tokens that stay in decoded text,
    as Qwen's `<think>` and `<tool_call>` do, the last ids of the vocabulary)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(extra_tokens),
        special_tokens=[*SPECIAL_TOKENS, *extra_special_tokens],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(_training_text(), trainer=trainer)
    # Added after training, not as the trainer's special tokens: those stay special (skipped when decoding).
    core.add_tokens([AddedToken(token, special=False, normalized=False) for token in extra_tokens])
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
