"""Live progress for the client commands: the upload's bytes, a running batch, downloads; Ctrl-C asks first.

Bars go to stderr and only when it is a terminal (tqdm's `disable=None`), so scripts get clean output.
"""

from __future__ import annotations

import io
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, cast

from tqdm import tqdm

from client.batch_workflow import trial_paused, trial_running
from client.remote import TERMINAL, extra, note

if TYPE_CHECKING:
    import openai
    from openai.types import Batch

POLL_SECONDS = 1.0


class UploadReader(io.RawIOBase):
    """A file the SDK streams from, moving a byte bar as the HTTP client reads it (rewinds on a retry)."""

    def __init__(self, path: Path, bar: tqdm[Any]) -> None:
        super().__init__()
        self._file = path.open("rb")
        self._bar = bar
        self.name = path.name

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        chunk = self._file.read(size)
        self._bar.update(len(chunk))
        return chunk

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        position = self._file.seek(offset, whence)
        self._bar.reset(total=self._bar.total)
        self._bar.update(position)
        return position

    def tell(self) -> int:
        return self._file.tell()

    def fileno(self) -> int:
        return self._file.fileno()

    def close(self) -> None:
        self._file.close()
        super().close()


def upload(client: openai.OpenAI, path: Path) -> Any:
    """Upload `path` as a `batch` file with a byte progress bar; return the SDK's FileObject."""
    size = path.stat().st_size
    with tqdm(total=size, unit="B", unit_scale=True, unit_divisor=1024, desc="upload", disable=None) as bar:
        reader = UploadReader(path, bar)
        try:
            return client.files.create(file=(path.name, cast(IO[bytes], reader)), purpose="batch")
        finally:
            reader.close()


def watch(client: openai.OpenAI, batch: Batch, *, poll_seconds: float = POLL_SECONDS) -> Batch:
    """Follow the batch until it ends, or its trial's report pauses it (nothing runs until someone resumes or cancels
    it), with a bar of finished/total requests, throughput and ETA (Ctrl-C raises).

    Each look is a long-poll of up to `poll_seconds` (`GET /v1/batches/{id}/wait`), so the end is seen the moment
    it commits; a server without that route (OpenAI, an older Backfill) is polled every `poll_seconds` instead."""
    counts = batch.request_counts
    # Start at what is already finished, so the rate and ETA measure only progress made while watching.
    bar: tqdm[Any] = tqdm(total=counts.total if counts else 0, initial=_ran(batch)[0], unit="req", disable=None)
    waits = [True]  # False once the server showed it has no long-poll
    try:
        while True:
            _show(bar, batch)
            if batch.status in TERMINAL or trial_paused(batch):
                return batch
            batch = next_look(client, batch, seconds=poll_seconds, waits=waits)
    finally:
        bar.close()


def next_look(client: openai.OpenAI, batch: Batch, *, seconds: float, waits: list[bool]) -> Batch:
    """The batch after a long-poll of up to `seconds` (it answers at once when the batch ends), or after `seconds`
    of sleep and a retrieve where the server has no long-poll (`waits[0]` turns False the first time)."""
    import openai
    from openai.types import Batch

    if waits[0]:
        try:
            return client.get(f"/batches/{batch.id}/wait", cast_to=Batch, options={"params": {"timeout": seconds}})
        except openai.NotFoundError:  # no such route here (OpenAI, an older Backfill): or the batch went, as below
            waits[0] = False
        except openai.APIConnectionError:  # a blip while waiting is not the batch's fault: keep the last state
            time.sleep(seconds)
            return batch
    time.sleep(seconds)
    return _retrieve(client, batch)


def _retrieve(client: openai.OpenAI, batch: Batch) -> Batch:
    import openai

    try:
        return client.batches.retrieve(batch.id)
    except openai.APIConnectionError:  # a blip while waiting is not the batch's fault: keep the last state
        return batch


def _ran(batch: Batch) -> tuple[int, int, dict[str, int]]:
    """(requests that ran, of them failed, {cancelled, expired}): a request a cancel or the window's end
    closed counts as failed in OpenAI's counts, but it never ran, so the bar leaves it out."""
    counts = batch.request_counts
    goodput = extra(batch, "goodput") or {}
    closed = {name: int(goodput.get(name) or 0) for name in ("cancelled", "expired")}
    failed = max(0, (counts.failed if counts else 0) - sum(closed.values()))
    return (counts.completed if counts else 0) + failed, failed, closed


VALIDATING_FORMAT = "{desc}: checking the input file and queueing its requests"


def _show(bar: tqdm[Any], batch: Batch) -> None:
    counts = batch.request_counts
    total = counts.total if counts else 0
    finished, failed, closed = _ran(batch)
    if total and bar.total != total:
        bar.reset(total=total)
    # No total while the file is checked: no count or rate yet, just the step.
    bar.bar_format = VALIDATING_FORMAT if not total and batch.status == "validating" else None
    bar.set_description_str("trial" if trial_running(batch) else batch.status, refresh=False)
    postfix = [f"failed={failed}"] + [f"{name}={count}" for name, count in closed.items() if count]
    bar.set_postfix_str(" ".join(postfix), refresh=False)
    if finished > bar.n:
        bar.update(finished - bar.n)
    else:
        bar.n = finished
        bar.refresh()


def ask(question: str) -> bool:
    """A yes/no question on the terminal; anything but y/yes, or no terminal at all, is no."""
    if not sys.stdin.isatty():
        return False
    try:
        answer = input(question)
    except (EOFError, KeyboardInterrupt):
        print(file=sys.stderr)
        return False
    return answer.strip().lower() in {"y", "yes"}


def watch_or_cancel(client: openai.OpenAI, batch: Batch, *, on_left_running: Callable[[Batch], None]) -> Batch | None:
    """Watch the batch; Ctrl-C asks whether to cancel it. None: the user left it running."""
    try:
        return watch(client, batch)
    except KeyboardInterrupt:
        pass
    if not ask(f"\nCancel batch {batch.id}? [y/N] "):
        on_left_running(batch)
        return None
    cancelled = client.batches.cancel(batch.id)
    note(f"cancelling {batch.id}; waiting for it to stop (Ctrl-C again leaves it cancelling)")
    try:
        return watch(client, cancelled)
    except KeyboardInterrupt:
        on_left_running(cancelled)
        return None


def download(client: openai.OpenAI, file_id: str, destination: Path) -> int:
    """Stream a file's content to `destination` (atomically, with a byte bar); return its size."""
    destination.parent.mkdir(parents=True, exist_ok=True)
    partial = destination.with_name(destination.name + ".part")
    size = 0
    with client.files.with_streaming_response.content(file_id) as response:
        total = int(response.headers.get("content-length") or 0) or None
        with (
            partial.open("wb") as out,
            tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=destination.name, disable=None) as bar,
        ):
            for chunk in response.iter_bytes(1024 * 1024):
                out.write(chunk)
                size += len(chunk)
                bar.update(len(chunk))
    partial.replace(destination)
    return size
