"""Ingest benchmark: upload + validate + enqueue a 50,000-line (~200 MB) file through the real API
on Postgres + S3 (moto's server), and build the output file of a 50,000-request batch.

Prints lines/s and the API process's peak RSS (sampled every 50 ms), the validate + enqueue rate apart
from the upload, and the upload's throughput against a raw boto3 multipart upload of the same bytes to
the same endpoint in the same run (so moto's own cost is visible apart from Backfill's). With `--lines
500000 --out-name ingest-big` and the limits raised it is the GB-scale run (time per line against the
50,000-line run: no quadratic step). `--upload-rounds N` uploads N times, each between two raw boto3
uploads (the ratio is the median over rounds, the spread is kept); `--upload-only` stops there. Usage:
    .venv/bin/python bench/ingest.py [--lines 50000] [--line-bytes 4000] [--out-name ingest] [--skip-output-file]
        [--upload-rounds 3] [--upload-only]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import openai
import psutil
import sqlalchemy as sa

ROOT = Path(__file__).resolve().parents[1]
PG_ADMIN = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


class PeakRss:
    def __init__(self, pid: int) -> None:
        self.proc = psutil.Process(pid)
        self.peak = 0
        self.samples: list[tuple[float, int]] = []
        self.started = time.time()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                rss = self.proc.memory_info().rss
            except psutil.Error:
                return
            self.peak = max(self.peak, rss)
            self.samples.append((time.time() - self.started, rss))
            time.sleep(0.05)


def make_file(path: Path, lines: int, line_bytes: int) -> int:
    filler = "x" * max(0, line_bytes - 200)
    with path.open("w") as handle:
        for i in range(lines):
            body = {"model": "fake-model", "messages": [{"role": "user", "content": f"{i} {filler}"}], "max_tokens": 1}
            handle.write(
                json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions", "body": body})
            )
            handle.write("\n")
    return path.stat().st_size


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=50_000)
    parser.add_argument("--line-bytes", type=int, default=4000)
    parser.add_argument("--out-name", default="ingest", help="results go to bench/out/NAME.json")
    parser.add_argument("--skip-output-file", action="store_true", help="do not rebuild the output file")
    parser.add_argument("--ingest-only", action="store_true", help="stop once the batch is enqueued (no run)")
    parser.add_argument("--upload-rounds", type=int, default=1, help="uploads, each between two raw boto3 uploads")
    parser.add_argument("--upload-only", action="store_true", help="stop after the upload rounds")
    parser.add_argument(
        "--moto-threaded",
        action="store_true",
        help="moto's server in this process (sharing the uploading client's GIL), as before issue 22 section 6",
    )
    args = parser.parse_args()
    out = ROOT / "bench" / "out"
    out.mkdir(parents=True, exist_ok=True)
    source = out / f"{args.out_name}.jsonl"
    size = make_file(source, args.lines, args.line_bytes)

    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1")
    moto_port, stop_moto, moto_pid = start_moto(threaded=args.moto_threaded)
    dbname = f"backfill_bench_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{dbname}"'))
    env = {
        **os.environ,
        "BACKFILL_DATABASE_URL": f"postgresql://postgres@127.0.0.1:5432/{dbname}",
        "BACKFILL_S3_ENDPOINT_URL": f"http://127.0.0.1:{moto_port}",
        "BACKFILL_S3_BUCKET": "bench",
        "BACKFILL_DATA_DIR": str(out / "ingest-data"),
        "BACKFILL_MODELS": json.dumps({"fake-model": {"path": "fake:", "max_num_seqs": 256}}),
        "BACKFILL_LOG_LEVEL": "WARNING",
        "MALLOC_ARENA_MAX": "2",  # as infra/Dockerfile runs every Backfill process
        # The operator's raised limits, so the GB-scale run is accepted (the defaults stay OpenAI's).
        "BACKFILL_UPLOAD_MAX_BYTES": str(max(200 * 1024 * 1024, size + 1024 * 1024)),
        "BACKFILL_BATCH_MAX_REQUESTS": str(max(50_000, args.lines)),
    }
    import boto3

    boto3.client("s3", endpoint_url=env["BACKFILL_S3_ENDPOINT_URL"]).create_bucket(Bucket="bench")
    backfill = [sys.executable, "-m", "worker.cli"]
    subprocess.run([*backfill, "migrate"], env=env, check=True, cwd=ROOT, capture_output=True)
    key = (
        subprocess.run(
            [*backfill, "keys", "create", "--tenant", "bench"],
            env=env,
            check=True,
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    port = 18000 + os.getpid() % 1000
    # An embedded worker is not wanted here: ingest runs in-process with the API (no Redis), on a fake engine.
    server = subprocess.Popen(
        [*backfill, "serve", "--port", str(port)],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(200):
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health").json().get("worker") == "ready":
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        rss = PeakRss(server.pid)
        baseline = psutil.Process(server.pid).memory_info().rss
        client = openai.OpenAI(api_key=key, base_url=f"http://127.0.0.1:{port}/v1", timeout=3600)
        api = psutil.Process(server.pid)
        # Rounds alternate raw boto3 and the upload route (raw, upload, raw, ..., upload, raw): each upload is
        # judged against the raw uploads either side of it, so a change of load on a shared machine hits both.
        s3_cpu = S3Cpu(moto_pid)
        raws = [s3_cpu.during("raw", raw_upload_seconds, env["BACKFILL_S3_ENDPOINT_URL"], source)]
        uploads: list[float] = []
        cpus: list[float] = []
        marks: dict[str, float] = {}
        uploaded = None
        for _ in range(args.upload_rounds):
            cpu_before = sum(api.cpu_times()[:2])
            started = time.perf_counter()
            with source.open("rb") as handle:
                done = s3_cpu.during("route", client.files.create, file=("ingest.jsonl", handle), purpose="batch")
            uploads.append(time.perf_counter() - started)
            cpus.append(sum(api.cpu_times()[:2]) - cpu_before)
            marks.setdefault("upload done", time.time() - rss.started)
            if uploaded is None:
                uploaded = done
            else:
                client.files.delete(done.id)
            raws.append(s3_cpu.during("raw", raw_upload_seconds, env["BACKFILL_S3_ENDPOINT_URL"], source))
        assert uploaded is not None
        upload_peak = rss.peak  # the uploads alone, before validation reads the file back
        ratios = [(raws[i] + raws[i + 1]) / 2 / seconds for i, seconds in enumerate(uploads)]
        upload_seconds = statistics.median(uploads)
        upload = {
            "file_mb": round(size / 1e6, 1),
            "upload_seconds": round(upload_seconds, 2),
            "upload_seconds_rounds": [round(x, 2) for x in uploads],
            "raw_boto3_upload_seconds": round(statistics.median(raws), 2),
            "raw_boto3_upload_seconds_rounds": [round(x, 2) for x in raws],
            # The API process's CPU during an upload: the rest of its wall time is waiting on the client's
            # single HTTP stream and on S3 (boto3's baseline sends ten parts at once).
            "api_cpu_seconds_during_upload": round(statistics.median(cpus), 2),
            # The S3 server's own CPU (moto in its own process) during each kind of upload: the same bytes arrive.
            "s3_server_cpu_seconds_route": s3_cpu.median("route"),
            "s3_server_cpu_seconds_raw_boto3": s3_cpu.median("raw"),
            "moto": "threaded, in the bench process" if args.moto_threaded else "its own process",
            # Each upload against the mean of the raw uploads either side; the median over rounds is the measure.
            "upload_throughput_ratio_rounds": [round(x, 3) for x in ratios],
            "upload_throughput_ratio_vs_raw_boto3": round(statistics.median(ratios), 3),
            "api_rss_baseline_mb": round(baseline / 2**20),
            "api_peak_rss_mb_upload": round(upload_peak / 2**20),
        }
        if args.upload_only:
            print(json.dumps(upload, indent=2))
            (out / f"{args.out_name}.json").write_text(json.dumps({"result": upload}))
            return 0
        started = time.perf_counter()
        batch = client.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        while (batch := client.batches.retrieve(batch.id)).status == "validating":
            time.sleep(0.05)
        queued_at = time.perf_counter()
        marks["enqueued"] = time.time() - rss.started
        ingest_peak = rss.peak  # upload, validate and enqueue; the batch's run and finalize come after
        read_seconds = raw_read_seconds(env["BACKFILL_S3_ENDPOINT_URL"], source)
        pass_seconds = ingest_pass_seconds(f"http://127.0.0.1:{port}/metrics")
        while not args.ingest_only and (batch := client.batches.retrieve(batch.id)).status not in {
            "completed",
            "failed",
        }:
            time.sleep(0.2)
        done_at = time.perf_counter()
        rss.stop.set()
        output = {"lines": None, "mb": None, "seconds": None, "lines_per_s": None, "rss_baseline_mb": None}
        output |= {"peak_rss_mb": None, "rss": []}
        if not (args.skip_output_file or args.ingest_only):
            rebuilt = subprocess.run(
                [sys.executable, str(ROOT / "bench" / "output_file.py"), batch.id],
                env=env,
                cwd=ROOT,
                check=True,
                capture_output=True,
                text=True,
            )
            output = json.loads(rebuilt.stdout.strip().splitlines()[-1])
        validate_seconds = queued_at - started
        result = {
            "lines": args.lines,
            **upload,
            "validate_enqueue_seconds": round(validate_seconds, 2),
            "validate_enqueue_lines_per_s": round(args.lines / validate_seconds),
            "validate_enqueue_us_per_line": round(validate_seconds / args.lines * 1e6, 1),
            # What reading the file from this S3 endpoint costs alone (moto is Python: ~100 MB/s here), and the
            # rate of Backfill's own checking and enqueueing once that read is taken out.
            "raw_s3_read_seconds": round(read_seconds, 2),
            # The worker's own ingest pass (backfill_ingest_seconds on /metrics): the wake-up and the
            # client's polling interval are left out.
            "ingest_pass_seconds": round(pass_seconds, 2),
            "ingest_pass_lines_per_s": round(args.lines / max(pass_seconds, 1e-3)),
            "validate_enqueue_lines_per_s_net_of_read": round(args.lines / max(validate_seconds - read_seconds, 1e-3)),
            "ingest_lines_per_s": round(args.lines / (upload_seconds + validate_seconds)),
            "run_and_finalize_seconds": round(done_at - queued_at, 2),
            "status": batch.status,
            "api_rss_baseline_mb": round(baseline / 2**20),
            "api_peak_rss_mb_upload_and_ingest": round(ingest_peak / 2**20),
            "api_peak_rss_mb": round(rss.peak / 2**20),
            "output_file_lines": output["lines"],
            "output_file_mb": output["mb"],
            "output_file_seconds": output["seconds"],
            "output_file_lines_per_s": output["lines_per_s"],
            "output_file_rss_baseline_mb": output["rss_baseline_mb"],
            "output_file_peak_rss_mb": output["peak_rss_mb"],
        }
        print(json.dumps(result, indent=2))
        (out / f"{args.out_name}.json").write_text(
            json.dumps({"result": result, "rss": rss.samples, "output_rss": output["rss"], "marks": marks})
        )
        if args.out_name == "ingest":
            plot_memory(rss.samples, output["rss"], marks)
    finally:
        server.terminate()
        server.wait(30)
        stop_moto()
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)'))
    return 0


class S3Cpu:
    """The CPU seconds moto's own process spends while a call runs, by kind of upload (None when threaded)."""

    def __init__(self, pid: int | None) -> None:
        self.proc = psutil.Process(pid) if pid is not None else None
        self.seen: dict[str, list[float]] = {}

    def during(self, kind: str, call: Any, *args: Any, **kwargs: Any) -> Any:
        before = sum(self.proc.cpu_times()[:2]) if self.proc else 0.0
        result = call(*args, **kwargs)
        if self.proc:
            self.seen.setdefault(kind, []).append(sum(self.proc.cpu_times()[:2]) - before)
        return result

    def median(self, kind: str) -> float | None:
        return round(statistics.median(self.seen[kind]), 2) if kind in self.seen else None


def start_moto(*, threaded: bool) -> tuple[int, Any, int | None]:
    """moto's S3 server on a free port, how to stop it and its own process id: in its own process by default,
    as S3 is to a client (in this process, the uploading client and the server it feeds share one GIL)."""
    if threaded:
        from moto.server import ThreadedMotoServer

        moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        moto.start()
        return moto._server.server_port, moto.stop, None  # type: ignore[attr-defined]
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(300):
        try:
            httpx.get(f"http://127.0.0.1:{port}/moto-api/", timeout=1)
            break
        except httpx.HTTPError:
            time.sleep(0.1)

    def stop() -> None:
        proc.terminate()
        proc.wait(30)

    return port, stop, proc.pid


def raw_upload_seconds(endpoint: str, source: Path) -> float:
    """A plain boto3 multipart upload of the same file to the same S3 endpoint, as the baseline (the object
    is removed afterwards, so the server holds the same objects before every round)."""
    import boto3
    from boto3.s3.transfer import TransferConfig

    client = boto3.client("s3", endpoint_url=endpoint)
    config = TransferConfig(multipart_threshold=16 * 1024 * 1024, multipart_chunksize=16 * 1024 * 1024)
    key = f"raw/{uuid.uuid4().hex}"
    started = time.perf_counter()
    client.upload_file(str(source), "bench", key, Config=config)
    seconds = time.perf_counter() - started
    client.delete_object(Bucket="bench", Key=key)
    return seconds


def ingest_pass_seconds(metrics_url: str) -> float:
    """Seconds the worker spent in ingest passes, summed from the API's /metrics (embedded worker)."""
    total = 0.0
    for line in httpx.get(metrics_url).text.splitlines():
        if line.startswith("backfill_ingest_seconds_sum"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def raw_read_seconds(endpoint: str, source: Path) -> float:
    """A plain boto3 streamed GET of the same bytes in 1 MiB chunks (as ingest reads them), as the baseline
    of what reading the file from this endpoint costs before any line is checked."""
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint)
    key = f"raw/{uuid.uuid4().hex}"
    client.upload_file(str(source), "bench", key)
    started = time.perf_counter()
    body = client.get_object(Bucket="bench", Key=key)["Body"]
    for _ in body.iter_chunks(1024 * 1024):
        pass
    seconds = time.perf_counter() - started
    client.delete_object(Bucket="bench", Key=key)
    return seconds


def plot_memory(api: list[tuple[float, int]], output: list[tuple[float, int]], marks: dict[str, float]) -> None:
    """API process RSS while a 50,000-line file is uploaded, validated and enqueued, and the output-file
    builder's RSS: docs/ingest-memory.png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6), gridspec_kw={"width_ratios": [2, 1]})
    left.plot([t for t, _ in api], [r / 2**20 for _, r in api], label="API process RSS")
    for name in ("upload done", "enqueued"):
        left.axvline(marks[name], color="grey", linestyle=":", linewidth=1)
        left.text(marks[name], left.get_ylim()[1] * 0.95, f" {name}", fontsize=8, va="top")
    left.axhline(256, color="C3", linestyle="--", linewidth=1, label="goal: < 256 MB")
    left.set_xlabel("seconds")
    left.set_ylabel("MiB")
    left.set_title("Ingest of 50,000 lines (~200 MB)")
    left.legend(fontsize=8, loc="lower right")
    right.plot([t for t, _ in output], [r / 2**20 for _, r in output], color="C2")
    right.set_xlabel("seconds")
    right.set_title("Building its output file")
    fig.tight_layout()
    sys.path.insert(0, str(ROOT))
    from bench._setup import plot_dir

    fig.savefig(plot_dir() / "ingest-memory.png", dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
