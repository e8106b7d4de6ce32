"""Prefix keys of Responses lines: the instructions lead, as when they are rendered as chat."""

from __future__ import annotations

from storage.queue.prefixes import prefix_key_of

RESPONSES = "/v1/responses"


def test_responses_lines_sharing_instructions_share_a_prefix_key_and_others_do_not() -> None:
    first = prefix_key_of(RESPONSES, {"instructions": "Grade this essay.", "input": "essay one"}, chars=512)
    second = prefix_key_of(RESPONSES, {"instructions": "Grade this essay.", "input": "essay two"}, chars=512)
    other = prefix_key_of(RESPONSES, {"instructions": "Translate it.", "input": "essay one"}, chars=512)
    assert first and first == second != other


def test_a_responses_line_keys_like_the_chat_line_it_runs_as() -> None:
    items = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    responses = prefix_key_of(RESPONSES, {"input": items}, chars=512)
    chat = prefix_key_of("/v1/chat/completions", {"messages": items}, chars=512)
    assert responses == chat != ""
