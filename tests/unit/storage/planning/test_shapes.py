"""Sizing a line without a tokenizer: a Responses line's output cap is its max_output_tokens."""

from __future__ import annotations

from storage.planning.shapes import DEFAULT_MAX_TOKENS, output_limit


def test_a_responses_line_is_sized_by_max_output_tokens() -> None:
    assert output_limit({"input": "hi", "max_output_tokens": 77}, "/v1/responses") == 77
    assert output_limit({"input": "hi"}, "/v1/responses") == DEFAULT_MAX_TOKENS
    assert output_limit({"input": "hi"}, "/v1/embeddings") == 0
