"""What the client commands say about how a batch ended: its retries and spend cap in `batches show`, a retry
whose every line failed again, a batch its spend cap stopped."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import LiveServer
from tests.integration.api.conftest import FAKE_MODELS
from tests.integration.api.helpers import chat_line, to_jsonl, upload, wait_for

pytestmark = [
    pytest.mark.parametrize("backend", ["embedded"], indirect=True),  # the client's view: one backend is enough
    pytest.mark.backfill_env({"BACKFILL_MODELS": FAKE_MODELS}),
]


def fields(out: str) -> dict[str, str]:
    """`batches show`'s `key  value` lines (keys of one or two words, values after two spaces)."""
    return dict(line.split("  ", 1) for line in out.splitlines() if "  " in line and not line.startswith(" "))


def test_a_retry_whose_every_line_failed_again_exits_non_zero_and_show_links_both_ways_with_the_cap(  # type: ignore[no-untyped-def]
    cli, server: LiveServer, key: str
) -> None:
    client = server.client(key)
    lines = [chat_line(i, max_tokens=2, min_tokens=5) for i in range(3)]  # each a 400 invalid_value, every time
    origin = client.batches.create(
        input_file_id=upload(client, to_jsonl(lines)).id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        extra_body={"max_cost_usd": "5"},
    )
    assert wait_for(client, origin.id).request_counts.failed == 3  # type: ignore[union-attr]

    code, out, _ = cli("batches", "retry", origin.id, "--codes", "invalid_value", "--wait")
    assert code == 3, out  # completed, but it fixed nothing: a script must not take it for a success
    assert "every one of its 3 requests failed again" in out
    retry_id = out.split()[0]

    code, out, _ = cli("batches", "show", origin.id)
    shown = {name.strip(): value.strip() for name, value in fields(out).items()}
    assert code == 0 and shown["retries"] == retry_id and shown["spend cap"].startswith("$5.000000")
    code, out, _ = cli("batches", "show", retry_id)
    assert {name.strip(): value.strip() for name, value in fields(out).items()}["retry of"] == origin.id


PRICED = {
    "BACKFILL_MODELS": FAKE_MODELS,
    # one output token bills exactly $1 in the 24h window (list $2, 50% off); input is free
    "BACKFILL_PRICE_BOOK": '{"prices": [{"model": "fake-model", "effective_from": "2025-01-01", '
    '"input_usd_per_mtok": "0", "output_usd_per_mtok": "2000000"}]}',
}


@pytest.mark.backfill_env(PRICED)
def test_submit_wait_says_when_the_spend_cap_stopped_the_batch(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_bytes(to_jsonl([chat_line(i, max_tokens=4) for i in range(40)]))  # $4 a line, $160 in all
    code, out, _ = cli("submit", str(jobs), "--max-cost-usd", "10", "--wait", "-o", str(tmp_path))
    summary = out.strip().splitlines()[-1]
    assert code == 0 and " completed · " in summary, out  # the batch ended as OpenAI's would: completed
    assert "stopped early: the batch stopped at its max_cost_usd of $10" in summary, summary
    assert "its unrun lines ended as budget_exceeded" in summary


def test_submit_sends_a_trial_and_checks_and_the_batch_shows_them(
    cli, server: LiveServer, key: str, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_bytes(to_jsonl([chat_line(i, max_tokens=1) for i in range(6)]))
    trial = '{"lines": 2, "continue": "auto", "min_success_rate": 0}'
    code, out, _ = cli(
        "submit", str(jobs), "--trial", trial, "--checks", '{"max_length": 40}', "--wait", "-o", str(tmp_path)
    )
    assert code == 0, out
    batch = server.client(key).batches.list().data[0]
    assert batch.model_extra and batch.model_extra["trial"]["report"]["lines_run"] == 2
    assert batch.model_extra["checks"] == {"schema": True, "max_attempts": 3, "max_length": 40}
    code, _, err = cli("submit", str(jobs), "--trial", "{lines: 2}")
    assert code != 0 and "--trial takes a JSON object" in err


def test_submit_sends_on_expiry_and_the_batch_shows_it(cli, server: LiveServer, key: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_bytes(to_jsonl([chat_line(i, max_tokens=1) for i in range(2)]))
    code, out, _ = cli("submit", str(jobs), "--on-expiry", "continue_in_background")
    assert code == 0, out
    batch = server.client(key).batches.list().data[0]
    assert batch.model_extra and batch.model_extra["on_expiry"] == "continue_in_background"
