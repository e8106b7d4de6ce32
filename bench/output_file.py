"""Build the output file of a finished batch again, in this process, and report seconds, lines/s and RSS.

Run by bench/ingest.py as a child process with the server's settings (so its memory is its own):
    .venv/bin/python bench/output_file.py BATCH_ID
Prints one JSON object. The file id is derived from the batch id, so this overwrites the same object.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    from storage import lifecycle
    from storage.batches.batches import get_batch
    from storage.db import get_engine, transaction
    from storage.files.blobs import get_blob_store
    from storage.files.files import tenant_folder
    from storage.lines.openai import result_line
    from worker.jobs.finalize import _SUCCESS, _write

    batch_id = sys.argv[1]
    blobs = get_blob_store()
    with transaction() as session:
        folder = tenant_folder(session, tenant_id=get_batch(session, tenant_id=None, batch_id=batch_id).tenant_id)
    get_engine().connect().close()  # connect before the baseline, as a running worker would be
    me = psutil.Process()
    baseline = me.memory_info().rss
    peak = [baseline]
    samples: list[tuple[float, int]] = []
    stop = threading.Event()

    def sample() -> None:
        start = time.time()
        while not stop.is_set():
            rss = me.memory_info().rss
            peak[0] = max(peak[0], rss)
            samples.append((time.time() - start, rss))
            time.sleep(0.02)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    started = time.perf_counter()
    written = _write(
        blobs,
        batch_id=batch_id,
        kind="output",
        folder=folder,
        statuses=_SUCCESS,
        render=result_line,
        name="output.jsonl",
    )
    seconds = time.perf_counter() - started
    stop.set()
    thread.join()
    assert written is not None, "the batch has no completed requests"
    _, blob = written
    size = blob.size
    from sqlalchemy import func, select

    from storage.models import BatchRequest

    with transaction() as session:
        lines = session.scalar(
            select(func.count()).where(
                BatchRequest.batch_id == batch_id, BatchRequest.status == lifecycle.REQ_COMPLETED
            )
        )
    print(
        json.dumps(
            {
                "lines": lines,
                "mb": round(size / 1e6, 1),
                "seconds": round(seconds, 2),
                "lines_per_s": round((lines or 0) / seconds),
                "rss_baseline_mb": round(baseline / 2**20),
                "peak_rss_mb": round(peak[0] / 2**20),
                "rss": samples,
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
