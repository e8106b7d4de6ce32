"""Prefix keys and the in-claim order, as pure functions."""

from __future__ import annotations

import pytest

from storage.queue.claim_order import ClaimOrder
from storage.queue.prefixes import SharedPrefixes, prefix_key_of, with_adapter

CHAT = "/v1/chat/completions"
SYSTEM = {"role": "system", "content": "You are a careful reviewer. " * 40}


def chat_key(*messages: dict[str, str], **extra: object) -> str:
    return prefix_key_of(CHAT, {"model": "m", "messages": list(messages), **extra}, chars=512)


def test_chat_requests_with_the_same_leading_messages_share_a_key_whatever_they_ask() -> None:
    first = chat_key(SYSTEM, {"role": "user", "content": "Review file a.py"})
    second = chat_key(SYSTEM, {"role": "user", "content": "Review file b.py, which is much longer"})
    other_system = chat_key({"role": "system", "content": "Be brief."}, {"role": "user", "content": "Review a.py"})

    assert first == second != other_system and len(first) == 32


def test_tools_are_part_of_the_chat_prefix() -> None:
    question = {"role": "user", "content": "What is the weather?"}
    tool = {"type": "function", "function": {"name": "weather", "parameters": {}}}

    assert chat_key(SYSTEM, question) != chat_key(SYSTEM, question, tools=[tool])


def test_a_single_message_is_keyed_by_its_first_characters() -> None:
    shared = "Translate the following text into French, keeping the markup. " * 10  # > 512 characters

    a = chat_key({"role": "user", "content": shared + "Hello"})
    b = chat_key({"role": "user", "content": shared + "Goodbye"})
    c = chat_key({"role": "user", "content": "Summarise: " + shared})

    assert a == b != c


def test_completion_prompts_are_keyed_by_their_first_characters_or_tokens() -> None:
    head = "x" * 600

    def key(prompt: object) -> str:
        return prefix_key_of("/v1/completions", {"model": "m", "prompt": prompt}, chars=512)

    assert key(head + "one") == key(head + "two") == key([head + "three", "other"])
    tokens = list(range(200))
    assert key([*tokens, 1]) == key([*tokens, 2]) != key([5, *tokens])
    assert key("short one") != key("short two")


def test_embeddings_and_malformed_bodies_have_no_prefix() -> None:
    assert prefix_key_of("/v1/embeddings", {"model": "m", "input": "hello"}, chars=512) == ""
    assert prefix_key_of(CHAT, {"model": "m", "messages": []}, chars=512) == ""
    assert prefix_key_of("/v1/completions", {"model": "m"}, chars=512) == ""


def test_a_claim_hands_out_urgent_rows_first_then_groups_by_bucket_and_prefix() -> None:
    order = ClaimOrder(urgent_before=1_000, prefix_ordering=True, bucket_seconds=100)
    rows = [("late-b", 1_150, "b"), ("soon", 900, "z"), ("late-a", 1_190, "a"), ("next-bucket", 1_210, "a")]

    ranked = sorted(range(len(rows)), key=lambda i: order.sort_key(rows[i][1], rows[i][2], i))

    assert [rows[i][0] for i in ranked] == ["soon", "late-a", "late-b", "next-bucket"]
    assert order.is_urgent(1_000) and not order.is_urgent(1_001)


def test_without_prefix_ordering_a_claim_goes_by_deadline() -> None:
    order = ClaimOrder(urgent_before=0, prefix_ordering=False)
    rows = [("b", 1_150, "a"), ("a", 1_100, "z")]

    ranked = sorted(range(len(rows)), key=lambda i: order.sort_key(rows[i][1], rows[i][2], i))

    assert [rows[i][0] for i in ranked] == ["a", "b"]


def test_a_prefix_key_is_kept_only_once_a_second_row_shares_it() -> None:
    prefixes = SharedPrefixes()
    rows = [{"line": i + 1} for i in range(6)]
    a, b, c = (prefix_key_of(CHAT, {"messages": [{"role": "user", "content": text}]}, chars=64) for text in "abc")
    for row, key in zip(rows[:3], [a, b, a], strict=True):
        prefixes.assign(row, key)
    prefixes.inserted()  # lines 1-3 are in the database now
    for row, key in zip(rows[3:], [b, c, ""], strict=True):
        prefixes.assign(row, key)

    assert [row["prefix_key"] for row in rows] == [a, "", a, b, "", ""]
    assert prefixes.late_keys == [(2, b)]  # line 2 was inserted before line 4 shared its prefix


def test_prefixes_seen_once_are_forgotten_past_a_bound_so_memory_stays_flat(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(SharedPrefixes, "ONCE_MAX", 4)  # two generations of two
    prefixes = SharedPrefixes()
    keys = [prefix_key_of(CHAT, {"messages": [{"role": "user", "content": f"p{i}"}]}, chars=64) for i in range(6)]
    rows = [{"line": i + 1} for i in range(8)]
    for row, key in zip(rows[:6], keys, strict=True):  # six distinct prefixes: only the latest ones are kept
        prefixes.assign(row, key)
    prefixes.assign(rows[6], keys[0])  # its first row was forgotten: unshared, line order
    prefixes.assign(rows[7], keys[5])  # still remembered: both rows get the key
    assert [row["prefix_key"] for row in rows] == ["", "", "", "", "", keys[5], "", keys[5]]
    assert len(prefixes._once) + len(prefixes._older) <= 4


def test_a_claim_keeps_each_adapters_rows_together_inside_a_deadline() -> None:
    order = ClaimOrder(urgent_before=0, prefix_ordering=False)
    rows = [("1", "b"), ("2", None), ("3", "a"), ("4", "b"), ("5", "a"), ("6", None)]

    ranked = sorted(range(len(rows)), key=lambda i: order.sort_key(1_000, "", i, rows[i][1]))

    assert [rows[i][0] for i in ranked] == ["2", "6", "3", "5", "1", "4"]  # the base model's first, pick order kept
    late = order.sort_key(2_000, "", 0, None)
    assert order.sort_key(1_000, "", 9, "z") < late  # never ahead of an earlier deadline


def test_the_same_prompt_under_two_adapters_has_two_prefix_keys() -> None:
    key = prefix_key_of(
        CHAT,
        {"model": "m", "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]},
        chars=512,
    )
    assert key and with_adapter(key, None) == key
    assert len({with_adapter(key, "a"), with_adapter(key, "b"), key}) == 3 and len(with_adapter(key, "a")) == 32
    assert with_adapter("", "a") == ""  # a prefix no other line shares stays unkeyed
