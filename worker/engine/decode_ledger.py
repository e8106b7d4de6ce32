"""The decode ledger: what the fake engines decoded, step by step, in files a kill -9 cannot take back.

Test and benchmark only (issue 21 item 8). The Prometheus counters `backfill_decode_tokens_*_total` die
with a killed process, so the share of decode work a kill throws away needs another source. A fake engine
whose model spec names a directory (`"extra": {"decode_ledger_dir": "..."}`, worker/engine/factory.py)
appends one line per event to a file of its own in that directory, each with one unbuffered `os.write`, so
a SIGKILL loses at most the step in progress (whose tokens nobody could have checkpointed or delivered):

    h <pid> <model>                        the file's header
    b <seq> <request id> <resumed> <n>     a request entered the engine; it starts from <resumed> checkpoint
                                           tokens and yields <n> tokens a step (its choices)
    s <seq> <seq> ...                      one step: each listed sequence generated its <n> tokens
    f <seq> <tokens>                       it finished; its result carries <tokens> completion tokens
    a <seq> ...                            aborted (handed back, lost, cancelled)

`read_ledger` sums every file of a directory per request id; `decode_figures` holds the sums against the
completion tokens each request delivered (its output line's usage). The definitions (docs/workers.md):

* decoded(r): tokens an engine generated for r, over every process and attempt, resumed prefixes not counted;
* delivered(r): the completion tokens of r's output line (0 for a request that ended without one);
* discarded(r) = decoded(r) - delivered(r) for a delivered request: work done and thrown away;
* the discard share = sum of discarded / sum of decoded, over delivered requests. Requests that ended without
  an output line (cancelled, stopped by a budget, failed) are counted apart (`undelivered_decoded`), outside
  the share: their work was not wanted in the end, whatever became of it.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

SPEC_KEY = "decode_ledger_dir"  # the model spec's `extra` key that turns the ledger on
_PREFIX = "decode-"


def ledger_from_extra(extra: Mapping[str, object], *, model: str) -> DecodeLedger | None:
    """The ledger a model spec's `extra` asks for (`decode_ledger_dir`), or None (the default: no ledger)."""
    directory = extra.get(SPEC_KEY)
    return DecodeLedger(str(directory), model=model) if directory else None


class DecodeLedger:
    """One engine's ledger file (created at its first line), appended to with unbuffered writes."""

    def __init__(self, directory: str | Path, *, model: str) -> None:
        self.path = Path(directory) / f"{_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}.log"
        self.model = model
        self._fd: int | None = None
        self._next = 0
        self._seq: dict[str, int] = {}  # request id -> its sequence number in this file, while in the engine

    def begin(self, request_id: str, *, resumed: int, choices: int) -> None:
        """A request entered the engine, continuing from `resumed` checkpoint tokens."""
        self._next += 1
        self._seq[request_id] = self._next
        self._write(f"b {self._next} {request_id} {resumed} {choices}\n")

    def step(self, request_ids: Iterable[str]) -> None:
        """These requests each generated one token (per choice) in this step."""
        seqs = [str(self._seq[rid]) for rid in request_ids if rid in self._seq]
        if seqs:
            self._write("s " + " ".join(seqs) + "\n")

    def finish(self, request_id: str, *, tokens: int) -> None:
        """The request finished with `tokens` completion tokens in its result."""
        if (seq := self._seq.pop(request_id, None)) is not None:
            self._write(f"f {seq} {tokens}\n")

    def abort(self, request_ids: Iterable[str]) -> None:
        """The requests left the engine unfinished."""
        seqs = [str(seq) for rid in request_ids if (seq := self._seq.pop(rid, None)) is not None]
        if seqs:
            self._write("a " + " ".join(seqs) + "\n")

    def close(self) -> None:
        """Close the file (a later line opens it again)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _write(self, line: str) -> None:
        if self._fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fresh = not self.path.exists()
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            if fresh:
                self._write(f"h {os.getpid()} {self.model}\n")
        data = line.encode()
        while data:  # a regular file takes it whole; loop anyway rather than lose the tail of a line
            data = data[os.write(self._fd, data) :]


@dataclass
class RequestDecode:
    """One request's decode work over every ledger file: what engines generated and started from."""

    decoded: int = 0  # tokens generated (resumed prefixes not counted), over every attempt
    resumed: int = 0  # checkpoint tokens its attempts started from (not decoded again)
    attempts: int = 0  # times it entered an engine
    finished: list[int] = field(default_factory=list)  # completion tokens of each result an engine produced


def read_ledger(directory: str | Path) -> dict[str, RequestDecode]:
    """Every ledger file of `directory`, summed per request id (a torn last line, a kill mid-write, is skipped)."""
    requests: dict[str, RequestDecode] = {}
    for path in sorted(Path(directory).glob(f"{_PREFIX}*.log")):
        _read_file(path.read_text(errors="replace"), requests)
    return requests


def _read_file(text: str, requests: dict[str, RequestDecode]) -> None:
    seqs: dict[str, tuple[RequestDecode, int]] = {}  # sequence number -> (its request, tokens per step)
    lines = text.split("\n")
    for line in lines[:-1]:  # the part after the last newline is a write the kill cut short
        kind, _, rest = line.partition(" ")
        fields = rest.split()
        if kind == "b":
            request = requests.setdefault(fields[1], RequestDecode())
            request.attempts += 1
            request.resumed += int(fields[2])
            seqs[fields[0]] = (request, int(fields[3]))
        elif kind == "s":
            for seq in fields:
                request, choices = seqs[seq]
                request.decoded += choices
        elif kind == "f":
            seqs[fields[0]][0].finished.append(int(fields[1]))


@dataclass(frozen=True)
class DecodeFigures:
    """A run's decode work against what it delivered (definitions: the module's docstring)."""

    decoded: int  # over delivered requests
    delivered: int
    resumed: int  # checkpoint tokens delivered requests started from instead of decoding them again
    discarded: int
    undelivered_decoded: int  # decoded for requests that ended without an output line (outside the share)
    undelivered_requests: int
    unaccounted: int  # delivered tokens no ledger saw decoded (0 unless a ledger is missing: a harness fault)
    # Results engines produced for delivered requests besides the delivered one (a pause handed them back
    # unstored): each costs at least its last token, which the resume must decode again.
    rerun_results: int = 0
    discarded_by_request: dict[str, int] = field(default_factory=dict)  # only requests that discarded some

    @property
    def share(self) -> float | None:
        """Discarded ÷ decoded over delivered requests (None when nothing was decoded)."""
        return self.discarded / self.decoded if self.decoded else None


def decode_figures(ledger: Mapping[str, RequestDecode], delivered: Mapping[str, int]) -> DecodeFigures:
    """Hold the ledger against `delivered` (request id -> completion tokens of its output line)."""
    decoded = resumed = discarded = unaccounted = undelivered = undelivered_requests = reruns = 0
    by_request: dict[str, int] = {}
    for rid, work in ledger.items():
        if rid not in delivered:
            undelivered += work.decoded
            undelivered_requests += 1
            continue
        decoded += work.decoded
        resumed += work.resumed
        reruns += max(0, len(work.finished) - 1)
        lost = work.decoded - delivered[rid]
        if lost > 0:
            discarded += lost
            by_request[rid] = lost
        else:
            unaccounted -= lost
    unaccounted += sum(tokens for rid, tokens in delivered.items() if rid not in ledger)
    return DecodeFigures(
        decoded=decoded,
        delivered=sum(delivered.values()),
        resumed=resumed,
        discarded=discarded,
        undelivered_decoded=undelivered,
        undelivered_requests=undelivered_requests,
        unaccounted=unaccounted,
        rerun_results=reruns,
        discarded_by_request=by_request,
    )
