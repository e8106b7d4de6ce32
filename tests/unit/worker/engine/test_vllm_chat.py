"""Direct chat rendering (worker/engine/vllm_chat.py): used only where it gives the renderer's engine input."""

from __future__ import annotations

from typing import Any

from worker.engine.vllm_chat import Conversation, DirectChat


class Tokenizer:
    """A template of `<role>text` turns and one id per character (what a real one does is the e2e tests')."""

    def __init__(self, *, bos: str = "^") -> None:
        self.bos = bos

    def apply_chat_template(self, conversation: Conversation, *, add_generation_prompt: bool, tokenize: bool) -> str:
        assert add_generation_prompt and not tokenize
        return self.bos + "".join(f"<{t['role']}>{t['content']}" for t in conversation) + "<assistant>"

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        assert not add_special_tokens
        return [ord(c) for c in text]


def renderer(tokenizer: Tokenizer, **extra: Any) -> Any:
    """What vLLM's renderer gives for a conversation, as the adapter's `_render` returns it."""

    def render(conversation: Conversation) -> dict[str, Any]:
        text = Tokenizer().apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
        ids = Tokenizer().encode(text, add_special_tokens=False)
        return {"type": "token", "prompt_token_ids": ids, "prompt": text, "arrival_time": 1.0, **extra}

    return render


def test_a_model_whose_template_matches_gets_the_renderers_engine_input_without_the_renderer() -> None:
    direct = DirectChat.probe(Tokenizer(), max_model_len=2048, render=renderer(Tokenizer()))
    assert direct is not None
    conversation = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    got = direct.render(conversation)
    expected = renderer(Tokenizer())(conversation)
    assert got is not None and got.pop("arrival_time") > 1.0
    assert got == {key: value for key, value in expected.items() if key != "arrival_time"}


def test_any_difference_on_a_probe_keeps_the_renderer() -> None:
    assert DirectChat.probe(Tokenizer(bos=""), max_model_len=2048, render=renderer(Tokenizer())) is None
    # A field the renderer adds that the direct path does not (a cache salt, multimodal inputs): the renderer.
    assert DirectChat.probe(Tokenizer(), max_model_len=2048, render=renderer(Tokenizer(), cache_salt="s")) is None


def test_a_template_that_fails_on_plain_turns_keeps_the_renderer() -> None:
    class Refusing(Tokenizer):
        def apply_chat_template(self, conversation: Conversation, **kwargs: Any) -> str:
            raise ValueError("this template wants tools")

    assert DirectChat.probe(Refusing(), max_model_len=2048, render=renderer(Tokenizer())) is None


def test_other_roles_and_prompts_near_the_context_go_to_the_renderer() -> None:
    direct = DirectChat.probe(Tokenizer(), max_model_len=200, render=renderer(Tokenizer()))
    assert direct is not None
    assert direct.render([{"role": "tool", "content": "42"}]) is None
    assert direct.render([{"role": "developer", "content": "Be brief."}]) is None
    # "^<user>" + text + "<assistant>" is 18 + len(text) ids; 8 short of the 200-token context is the limit.
    assert direct.render([{"role": "user", "content": "x" * 174}]) is not None
    assert direct.render([{"role": "user", "content": "x" * 175}]) is None


class Encoding:
    def __init__(self, ids: list[int]) -> None:
        self.ids = ids


class Backend:
    """A Rust tokenizer stand-in (`backend_tokenizer`): counts its calls; `shift` makes its ids differ."""

    def __init__(self, *, shift: int = 0) -> None:
        self.shift = shift
        self.calls = 0

    def encode(self, text: str, *, add_special_tokens: bool) -> Encoding:
        assert not add_special_tokens
        self.calls += 1
        return Encoding([ord(c) + self.shift for c in text])


class WithBackend(Tokenizer):
    def __init__(self, backend: Backend) -> None:
        super().__init__()
        self.backend_tokenizer = backend
        self.encoded = 0

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        self.encoded += 1
        return super().encode(text, add_special_tokens=add_special_tokens)


def test_a_backend_tokenizer_that_matches_encodes_every_prompt_on_the_calling_thread() -> None:
    backend = Backend()
    tokenizer = WithBackend(backend)
    direct = DirectChat.probe(tokenizer, max_model_len=2048, render=renderer(Tokenizer()))
    assert direct is not None
    before = (backend.calls, tokenizer.encoded)
    got = direct.render([{"role": "user", "content": "Hi"}])
    assert got is not None and got["prompt_token_ids"] == [ord(c) for c in "^<user>Hi<assistant>"]
    assert (backend.calls, tokenizer.encoded) == (before[0] + 1, before[1])  # the backend's, not the wrapper's


def test_a_backend_tokenizer_that_differs_leaves_the_tokenizers_own_encode() -> None:
    backend = Backend(shift=1)
    tokenizer = WithBackend(backend)
    direct = DirectChat.probe(tokenizer, max_model_len=2048, render=renderer(Tokenizer()))
    assert direct is not None  # still direct: the tokenizer's `encode` matches
    calls = backend.calls
    got = direct.render([{"role": "user", "content": "Hi"}])
    assert got is not None and got["prompt_token_ids"] == [ord(c) for c in "^<user>Hi<assistant>"]
    assert backend.calls == calls
