"""What the client commands (submit, batches, files, webhooks) share: the connection, errors, exit codes, tables.

They talk to a Backfill server over HTTP with the official openai SDK, so they work against any
deployment: `--base-url` / BACKFILL_BASE_URL / OPENAI_BASE_URL and `--api-key` / BACKFILL_API_KEY /
OPENAI_API_KEY (then the embedded server's `default-api-key` file, for `make run` on the same machine).
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the SDK is imported when a client command runs, so `serve` and `worker` start without it
    import openai

# Exit codes scripts can test (docs/cli.md).
EXIT_OK = 0  # done; for a batch: it completed
EXIT_ERROR = 1  # the server could not be reached, refused the key, or answered with an error
EXIT_USAGE = 2  # bad command line (argparse uses 2 as well), no API key, unreadable local file
EXIT_FAILED = 3
EXIT_EXPIRED = 4
EXIT_CANCELLED = 5
EXIT_NOT_FINISHED = 75  # the batch is still running (sysexits' EX_TEMPFAIL: try again later)
EXIT_INTERRUPTED = 130  # Ctrl-C; the batch was left running
STATUS_EXIT = {"completed": EXIT_OK, "failed": EXIT_FAILED, "expired": EXIT_EXPIRED, "cancelled": EXIT_CANCELLED}
TERMINAL = frozenset(STATUS_EXIT)
DEFAULT_BASE_URL = "http://127.0.0.1:8000"


class UsageError(Exception):
    """A bad command line or local input: one line on stderr, exit code 2."""


@dataclass(frozen=True)
class Remote:
    """A connected client and the URL it talks to (for messages)."""

    client: openai.OpenAI
    base_url: str


def add_connection_args(parser: argparse.ArgumentParser, *, json_output: bool = True) -> None:
    """The flags every client command takes."""
    group = parser.add_argument_group("server")
    group.add_argument(
        "--base-url",
        help=f"the Backfill server (default: $BACKFILL_BASE_URL, $OPENAI_BASE_URL, {DEFAULT_BASE_URL}); /v1 is added",
    )
    group.add_argument(
        "--api-key", help="API key (default: $BACKFILL_API_KEY, $OPENAI_API_KEY, the local default-api-key file)"
    )
    if json_output:
        parser.add_argument("--json", action="store_true", help="print JSON instead of a table (for scripts)")


def int_between(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: an integer in [low, high], with a one-line error otherwise."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be between {low} and {high}, got {value}")
        return value

    return parse


def base_url_of(args: argparse.Namespace) -> str:
    """The API root with /v1: the flag, else BACKFILL_BASE_URL, else OPENAI_BASE_URL, else the local default."""
    url = args.base_url or os.environ.get("BACKFILL_BASE_URL") or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise UsageError(f"--base-url must start with http:// or https://, got {url!r}")
    return url if url.endswith("/v1") else f"{url}/v1"


def api_key_of(args: argparse.Namespace) -> str:
    """The flag, else BACKFILL_API_KEY, else OPENAI_API_KEY, else the embedded server's default-api-key file."""
    key = args.api_key or os.environ.get("BACKFILL_API_KEY") or os.environ.get("OPENAI_API_KEY")
    if key:
        return str(key).strip()
    from storage.settings import get_settings

    path = get_settings().data_dir / "default-api-key"
    if path.is_file():
        return path.read_text().strip()
    raise UsageError("no API key: pass --api-key or set BACKFILL_API_KEY (or OPENAI_API_KEY)")


def connect(args: argparse.Namespace) -> Remote:
    """An openai client for the server the flags and environment name."""
    for name in ("httpx", "httpx2", "openai"):  # the SDK logs every request at INFO
        logging.getLogger(name).setLevel(logging.WARNING)
    import openai

    base_url = base_url_of(args)
    client = openai.OpenAI(base_url=base_url, api_key=api_key_of(args), max_retries=2, timeout=600)
    return Remote(client, base_url)


def remote_command(func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Turn the SDK's exceptions into one line on stderr and an exit code: no tracebacks for expected failures."""

    @functools.wraps(func)
    def run(args: argparse.Namespace) -> int:
        import openai

        try:
            return func(args)
        except UsageError as error:
            fail(str(error))
            return EXIT_USAGE
        except openai.APIConnectionError as error:
            cause = error.__cause__ or error
            fail(f"cannot reach the Backfill server at {base_url_or_unknown(args)}: {_short(cause)}")
        except openai.AuthenticationError as error:
            fail(f"the server at {base_url_or_unknown(args)} rejected the API key: {message_of(error)}")
        except openai.APIStatusError as error:
            fail(f"{message_of(error)} (HTTP {error.status_code})")
        except OSError as error:
            fail(str(error))
        return EXIT_ERROR

    return run


def base_url_or_unknown(args: argparse.Namespace) -> str:
    try:
        return base_url_of(args)
    except UsageError:
        return "?"


def message_of(error: openai.APIStatusError) -> str:
    """The `message` of OpenAI's error envelope, or the start of whatever else the server sent."""
    body = error.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and isinstance(inner.get("message"), str):
            return str(inner["message"])
    text = error.response.text.strip().replace("\n", " ")
    return _short(text or error.message)


def _short(value: object) -> str:
    text = str(value).strip() or type(value).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def fail(message: str) -> None:
    """One line on stderr."""
    print(f"backfill: error: {message}", file=sys.stderr)


def note(message: str) -> None:
    """Progress for people, on stderr, so stdout stays clean for scripts."""
    print(message, file=sys.stderr, flush=True)


def print_json(value: Any) -> None:
    """Pretty JSON on stdout (SDK objects as the server sent them)."""
    if hasattr(value, "model_dump"):
        value = value.model_dump(mode="json")
    print(json.dumps(value, indent=2, default=str))


def render_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Columns padded to their widest cell; numbers right-aligned."""
    cells = [[("" if cell is None else str(cell)) for cell in row] for row in rows]
    widths = [max(len(row[i]) for row in [list(header), *cells]) for i in range(len(header))]
    numeric = [all(_is_number(row[i]) for row in cells) and bool(cells) for i in range(len(header))]

    def line(row: Sequence[str]) -> str:
        parts = [c.rjust(w) if num else c.ljust(w) for c, w, num in zip(row, widths, numeric, strict=True)]
        return "  ".join(parts).rstrip()

    return "\n".join([line(list(header)), line(["-" * w for w in widths]), *(line(row) for row in cells)])


def _is_number(text: str) -> bool:
    return text.replace(",", "").replace(".", "", 1).isdigit()


def when(timestamp: int | float | None) -> str:
    """A Unix time as local 'YYYY-MM-DD HH:MM:SS' (empty for None)."""
    return "" if timestamp is None else datetime.fromtimestamp(timestamp).strftime("%Y-%m-%d %H:%M:%S")


def extra(obj: Any, name: str) -> Any:
    """A Backfill extension field the SDK keeps on its objects (e.g. `cost` on a batch)."""
    return (getattr(obj, "model_extra", None) or {}).get(name)
