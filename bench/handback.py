"""Spot notices and checkpoints (issue 21, items 2 and 5), on the GPU-timed fake (worker/engine/timed_fake.py).

  handback  the runner holds 384 in-flight sequences (every slot of 70B FP8 on 8x H100) that have each
            generated a few hundred tokens; `Runner.hand_back(drain_seconds=0)`, what a SIGTERM does once
            its drain is spent, is timed until the transaction that re-queues the rows with their token ids
            has committed (goal <= 2 s: a 30 s notice minus the drain leaves 10 s, SHUTDOWN_MARGIN_SECONDS).
  overhead  the same fixed GPU-timed run (long outputs, so periodic checkpoints are due) twice, each on a
            fresh database: with the default checkpoints and with BACKFILL_CHECKPOINT_EVERY_TOKENS=0 (only
            at hand-backs, today's write volume). Compared: the WAL the benchmark's database wrote (`WalMeter`,
            pg_walinspect: free of other work on the server; pg_stat_wal's cluster-wide bytes are reported
            too), rows updated and inserted and transactions committed in it (pg_stat_database). Goal:
            checkpoints add <= 10 % to the write volume. Run twice: with 1,000-3,000-token outputs
            (`--low`/`--high`) and with 6,000-10,000 (`--long-low`/`--long-high`), where rewriting a whole
            checkpoint at every write (its cost the square of the output) would show.
  --ids     the token ids the fake generates: Zipf-distributed like a model's output (the default) or
            uniform over a 128k vocabulary (the worst case for compression); see `_TokenIds`.

Usage: .venv/bin/python bench/handback.py [--quick] [--requests 768] [--low 1000] [--high 3000]
                                          [--long-low 6000] [--long-high 10000] [--long-requests N] [--no-long]
                                          [--no-short] [--ids zipf|uniform]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._setup import OUT
from bench.gpu_timed import MODEL, enqueue, prepare

SLOTS = 384


def _counters() -> dict[str, int]:
    """Cluster WAL bytes, and this database's updated/inserted rows and commits (after a stats flush)."""
    import sqlalchemy as sa

    from storage.db import get_engine

    get_engine().dispose()  # backends flush their statistics when they exit
    time.sleep(1.5)
    with get_engine().connect() as conn:
        conn.execute(sa.text("SELECT pg_stat_clear_snapshot()"))
        wal = conn.execute(sa.text("SELECT wal_bytes FROM pg_stat_wal")).scalar_one()
        row = conn.execute(
            sa.text(
                "SELECT tup_updated, tup_inserted, xact_commit FROM pg_stat_database WHERE datname = current_database()"
            )
        ).one()
    return {"wal_bytes": int(wal), "tup_updated": row[0], "tup_inserted": row[1], "xact_commit": row[2]}


class WalMeter(threading.Thread):
    """The WAL this database's own pages wrote (pg_walinspect): records whose block references name it.

    `pg_stat_wal` counts the whole cluster, so other work on a shared server (other benchmarks, tests) swamps
    a few per cent. Every few seconds (before a Postgres checkpoint can recycle the segments) this reads the
    records written since its last look and adds up those that touch a relation of the benchmark's database:
    heap, index and TOAST changes with their full-page images. Records that name no relation (commits) are
    left out: they are alike with and without checkpoints (the commit counts are reported beside).
    """

    def __init__(self) -> None:
        super().__init__(daemon=True)
        import sqlalchemy as sa

        from storage.settings import get_settings

        self.engine = sa.create_engine(get_settings().sqlalchemy_url, isolation_level="AUTOCOMMIT")
        # A temporary replication slot keeps the segments from now on until this connection closes: a checkpoint
        # (a CREATE or DROP DATABASE elsewhere requests one) would otherwise remove them before they are read.
        self.holder = self.engine.connect()
        slot = f"walmeter_{os.getpid()}_{threading.get_ident()}"
        self.holder.execute(sa.text("SELECT pg_create_physical_replication_slot(:s, true, true)"), {"s": slot})
        with self.engine.connect() as conn:
            conn.execute(sa.text("CREATE EXTENSION IF NOT EXISTS pg_walinspect"))
            oid = conn.execute(sa.text("SELECT oid FROM pg_database WHERE datname = current_database()")).scalar_one()
            self.since = conn.execute(sa.text("SELECT pg_current_wal_flush_lsn()")).scalar_one()
        self.pattern = f"%/{oid}/%"
        self.totals = {"db_wal_bytes": 0, "db_wal_fpi_bytes": 0, "db_wal_records": 0}
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(5.0):
            self._read()

    def stop(self) -> dict[str, int]:
        """The totals since the start (after a last look)."""
        self.stopping.set()
        self.join()
        try:
            self._read()
        finally:
            self.holder.close()  # the temporary slot goes with its session
            self.engine.dispose()
        return self.totals

    def _read(self) -> None:
        import sqlalchemy as sa

        with self.engine.connect() as conn:
            until = conn.execute(sa.text("SELECT pg_current_wal_flush_lsn()")).scalar_one()
            if until == self.since:
                return
            row = conn.execute(
                sa.text(
                    "SELECT coalesce(sum(record_length), 0), coalesce(sum(fpi_length), 0), count(*)"
                    " FROM pg_get_wal_records_info(CAST(:a AS pg_lsn), CAST(:b AS pg_lsn)) WHERE block_ref LIKE :p"
                ),
                {"a": self.since, "b": until, "p": self.pattern},
            ).one()
        self.since = until
        for key, value in zip(self.totals, row, strict=True):
            self.totals[key] += int(value)


VOCAB = 128_256  # Llama 3's vocabulary
ZIPF_EXPONENT = 1.0  # measured: see `_TokenIds`


class _TokenIds:
    """Real-looking token ids for the fake, whose own repeat and compress ~30x: per request, drawn with a seed of
    its id and only ever extended, so that a request's ids only grow from one read to the next.

    `uniform`: below 128,256, the worst case for the packing (17 bits of entropy a token, 2.1 bytes at least).
    `zipf` (the default): the k-th most frequent id drawn with weight 1/k**1.0, the k-th id being the k-th most
    frequent. Measured on English prose (Newton's Opticks, 567 KB, on disk with a dependency): rank-frequency
    exponent 1.10 with a WordPiece tokenizer (all-MiniLM-L6-v2, 30,522 ids), 1.00 with byte-level BPE
    tokenizers (Llama 3's kind) trained on other text (32k and 64k ids); their ids are in frequency order
    (the median id of the 1,000 most frequent is 1,800-3,600), as rank = id has it. Independent draws have
    no repeated phrases, so they pack worse than that text (2.1 bytes a token in the first format against
    1.3-1.6 for the real sequence): a mildly pessimistic stand-in."""

    def __init__(self, kind: str) -> None:
        import itertools

        self.kind = kind
        self.cum = list(itertools.accumulate(1 / (k + 1) ** ZIPF_EXPONENT for k in range(VOCAB)))
        self.drawn: dict[str, Any] = {}  # request id -> (its generator, its ids so far)

    def extend(self, progress: dict[str, Any]) -> dict[str, Any]:
        import random
        from array import array

        from worker.engine import Progress

        out = {}
        for rid, p in progress.items():
            rng, ids = self.drawn.setdefault(rid, (random.Random(rid), array("i")))
            if (more := len(p.token_ids) - len(ids)) > 0:
                if self.kind == "uniform":
                    ids.extend(rng.randrange(VOCAB) for _ in range(more))
                else:
                    ids.extend(rng.choices(range(VOCAB), cum_weights=self.cum, k=more))
            out[rid] = Progress(ids[: len(p.token_ids)].tolist(), p.exact)
        return out


IDS = ["zipf"]  # the kind of ids the fake generates (--ids)


def _runner() -> Any:
    """The GPU-timed fake and a runner; the fake's token ids made real-looking (`_TokenIds`)."""
    from storage.settings import get_settings
    from worker.engine.factory import load_engine
    from worker.feed.runner import Runner

    settings = get_settings()
    engine = load_engine(settings, MODEL)
    progress, ids = engine.progress, _TokenIds(IDS[0])
    engine.progress = lambda request_ids: ids.extend(progress(request_ids))
    return engine, Runner(engine, model=MODEL, settings=settings)


def handback(tokens: int) -> dict[str, Any]:
    """Time the hand-back of 384 sequences holding about `tokens` generated tokens each."""
    import sqlalchemy as sa

    from storage.db import get_engine

    prepare()
    enqueue(SLOTS * 2, low=tokens * 4, high=tokens * 4, seed=7, prompt_tokens=0)
    engine, runner = _runner()
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        runner.run_for(2.0)
        progress = engine.progress(sorted(runner.inflight))
        held = [len(p.token_ids) for p in progress.values()]
        if len(held) >= SLOTS and min(held) >= tokens:
            break
    generated = sum(held)
    started = time.perf_counter()
    released = runner.hand_back(drain_seconds=0)
    seconds = time.perf_counter() - started
    runner.close_io()
    with get_engine().connect() as conn:
        chunks = conn.execute(sa.text("SELECT to_regclass('checkpoint_chunks')")).scalar_one() is not None
        stored = conn.execute(sa.text(STORED[0 if chunks else 1])).one()
    return {
        "in_flight": len(held),
        "released": released,
        "generated_tokens": generated,
        "checkpointed_rows": stored[0],
        "checkpoint_bytes": int(stored[1]),
        "seconds": round(seconds, 3),
    }


# Checkpointed rows and the bytes they hold: the chunks (storage/queue/checkpoints.py), or, before migration
# 0018, the whole-list blob each row kept (so this script measures either version of the code).
STORED = (
    "SELECT count(DISTINCT request_id), coalesce(sum(octet_length(token_ids)), 0) FROM checkpoint_chunks",
    "SELECT count(*), coalesce(sum(octet_length(checkpoint)), 0) FROM batch_requests WHERE checkpoint IS NOT NULL",
)

PACKED: list[int] = []  # bytes of every checkpoint chunk packed for a write (after the guard let it through)
FIRST_FORMAT: list[int] = []  # what the same chunks take packed as the first version did (interleaved zlib)


def _count_packed() -> None:
    import zlib
    from array import array

    from storage.queue import checkpoints

    pack = checkpoints.pack_tokens

    def counted(token_ids: Any) -> bytes:
        blob = pack(token_ids)
        PACKED.append(len(blob))
        FIRST_FORMAT.append(len(zlib.compress(array("i", token_ids).tobytes(), 6)))
        return blob

    checkpoints.pack_tokens = counted


def overhead_run(requests: int, *, low: int, high: int, every_tokens: int) -> dict[str, Any]:
    """One fixed run to the end of the queue; the database's write counters over it."""
    os.environ["BACKFILL_CHECKPOINT_EVERY_TOKENS"] = str(every_tokens)
    PACKED.clear()
    FIRST_FORMAT.clear()
    prepare()
    enqueue(requests, low=low, high=high, seed=11, prompt_tokens=0)
    engine, runner = _runner()
    before = _counters()
    meter = WalMeter()
    meter.start()
    started = time.perf_counter()
    while runner.run_for(300.0):
        pass
    wall = time.perf_counter() - started
    runner.close_io()
    own = meter.stop()
    after = _counters()
    figures: dict[str, Any] = {k: after[k] - before[k] for k in after}
    figures.update(own)
    figures.update(checkpoint_writes=len(PACKED), checkpoint_payload_bytes=sum(PACKED))
    figures.update(checkpoint_payload_first_format_bytes=sum(FIRST_FORMAT))
    figures.update(
        every_tokens=every_tokens, wall_seconds=round(wall, 1), output_tokens=sum(s.tokens for s in engine.timeline)
    )
    return figures


def _no_fpi(run: dict[str, Any]) -> int:
    return int(run["db_wal_bytes"] - run["db_wal_fpi_bytes"])


def overhead(requests: int, *, low: int, high: int) -> dict[str, Any]:
    """The same run without and with periodic checkpoints, and what they add."""
    off = overhead_run(requests, low=low, high=high, every_tokens=0)
    print(f"checkpoints off ({low}-{high} tokens): {json.dumps(off)}", flush=True)
    on = overhead_run(requests, low=low, high=high, every_tokens=1024)
    print(f"checkpoints on (1024 tokens / 60 s, {low}-{high} tokens): {json.dumps(on)}", flush=True)

    def over(key: str) -> float | None:
        return round(on[key] / off[key] - 1, 4) if off[key] else None

    return {
        "off": off,
        "on": on,
        "low": low,
        "high": high,
        # The WAL of the benchmark's own database (`WalMeter`): what the goal is about, free of other work.
        "wal_overhead_ratio": over("db_wal_bytes"),
        "cluster_wal_overhead_ratio": over("wal_bytes"),
        # Without the full-page images: how many a run writes depends on when the server checkpoints (on a
        # shared server, whenever another database is created or dropped), not on what the run does.
        "wal_no_fpi_overhead_ratio": round(_no_fpi(on) / _no_fpi(off) - 1, 4) if _no_fpi(off) else None,
        # The periodic checkpoints' own bytes over the run's WAL without them: free of the server's other
        # traffic, and a floor (a row version and its TOAST chunks add their headers).
        "payload_overhead_ratio": round(on["checkpoint_payload_bytes"] / off["db_wal_bytes"], 4)
        if off["db_wal_bytes"]
        else None,
        "updated_rows_overhead_ratio": over("tup_updated"),
        "inserted_rows_overhead_ratio": over("tup_inserted"),
    }


RATIOS = (
    "wal_overhead_ratio",
    "cluster_wal_overhead_ratio",
    "wal_no_fpi_overhead_ratio",
    "payload_overhead_ratio",
    "updated_rows_overhead_ratio",
    "inserted_rows_overhead_ratio",
)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--requests", type=int, default=768)
    parser.add_argument("--low", type=int, default=1000)
    parser.add_argument("--high", type=int, default=3000)
    parser.add_argument("--long-low", type=int, default=6000)
    parser.add_argument("--long-high", type=int, default=10000)
    parser.add_argument("--long-requests", type=int, default=0, help="requests of the long-output pair (--requests)")
    parser.add_argument("--no-long", action="store_true", help="skip the long-output pair")
    parser.add_argument("--no-short", action="store_true", help="skip the short-output pair")
    parser.add_argument("--tokens", type=int, default=520, help="generated tokens per sequence at the hand-back")
    parser.add_argument("--ids", choices=["zipf", "uniform"], default="zipf", help="token ids drawn (`_TokenIds`)")
    args = parser.parse_args()
    IDS[0] = args.ids
    if args.quick:
        args.requests, args.tokens, args.no_long = 384, 200, True
    OUT.mkdir(parents=True, exist_ok=True)
    os.environ["BACKFILL_DATA_DIR"] = tempfile.mkdtemp(prefix="handback-", dir=OUT)
    # A context of 16,384 (the fake's default is 8,192): room for the long-output pair's 10,000-token answers.
    spec = {"path": "fake:gpu-timed", "max_num_seqs": SLOTS, "max_model_len": 16384}
    os.environ["BACKFILL_MODELS"] = json.dumps({MODEL: spec})
    os.environ.setdefault("BACKFILL_CHECKPOINT_INTERVAL_SECONDS", "60")
    _count_packed()
    back = handback(args.tokens)
    print(f"hand-back: {json.dumps(back)}", flush=True)
    short = {} if args.no_short else overhead(args.requests, low=args.low, high=args.high)
    result = {
        "handback": back,
        **short,
        "checkpoint_interval_seconds": float(os.environ["BACKFILL_CHECKPOINT_INTERVAL_SECONDS"]),
        "token_ids": args.ids,
    }
    if short:
        print(json.dumps({k: short[k] for k in RATIOS}), flush=True)
    if not args.no_long:
        result["long"] = overhead(args.long_requests or args.requests, low=args.long_low, high=args.long_high)
        print(json.dumps({f"{k}_long": result["long"][k] for k in RATIOS}), flush=True)
    (OUT / "handback.json").write_text(json.dumps({"result": result}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
