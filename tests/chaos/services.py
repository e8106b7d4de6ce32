"""The harness's own Postgres, Redis and S3 (moto behind a fault proxy), each on a free port.

Nothing here touches the machine's shared Postgres (5432) or Redis (6379): Postgres is a fresh cluster
(initdb into a temp dir), Redis runs without persistence, and moto keeps its objects in memory while the
proxy in front of it plays "S3 down".
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import boto3
import psycopg
from botocore.config import Config

from tests.chaos.procs import Child, free_port, wait_port
from tests.chaos.proxy import FaultProxy

AWS_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def postgres_bin() -> Path:
    """The newest installed Postgres' bin directory (Debian layout)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda path: int(Path(path).parent.name))
    if not found:
        raise RuntimeError("no Postgres binaries under /usr/lib/postgresql/*/bin")
    return Path(found[-1])


class Postgres:
    """A private Postgres cluster; `stop_immediate` is `pg_ctl stop -m immediate` (a crash, then recovery).

    `durable`: fsync and full-page writes on, as the machine's own server (bench/fleet_shards.py's shards, whose WAL
    is measured); the harness's default skips them (a crash it plays is a process's, not the machine's)."""

    def __init__(self, logs: Path, *, durable: bool = False) -> None:
        self.bin = postgres_bin()
        # Its own directory under /tmp: the postgres user must reach it, and test temp dirs are 0700 root's.
        self.root = Path(tempfile.mkdtemp(prefix="backfill-chaos-pg-"))
        self.logs = logs
        self.data = self.root / "data"
        self.port = free_port()
        self.user = "postgres" if os.geteuid() == 0 else None  # initdb refuses to run as root
        self.child = Child(
            "postgres",
            [
                str(self.bin / "postgres"),
                "-D",
                str(self.data),
                "-p",
                str(self.port),
                "-k",
                str(self.root),  # the unix socket goes here, not /var/run/postgresql
                "-c",
                "listen_addresses=127.0.0.1",
                # fsync only protects against an OS crash; an immediate stop still recovers from the WAL.
                "-c",
                f"fsync={'on' if durable else 'off'}",
                "-c",
                f"full_page_writes={'on' if durable else 'off'}",
                "-c",
                "max_connections=200",
            ],
            env={**os.environ, "LC_ALL": "C"},
            log_dir=logs,
            user=self.user,
        )

    def init(self) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        if self.user is not None:
            shutil.chown(self.root, self.user)
        command = [str(self.bin / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres", "-E", "UTF8"]
        if self.user is not None:
            command = ["runuser", "-u", self.user, "--", *command, "--no-sync"]
        subprocess.run(command, check=True, capture_output=True, env={**os.environ, "LC_ALL": "C"})

    def start(self) -> None:
        self.child.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if not self.child.alive():
                raise RuntimeError(f"postgres exited: {self.child.tail()}")
            try:
                with psycopg.connect(self.url("postgres"), connect_timeout=1):
                    return
            except psycopg.OperationalError:
                time.sleep(0.1)
        raise RuntimeError(f"postgres did not accept connections: {self.child.tail()}")

    def stop_immediate(self) -> None:
        """Abort every backend without a checkpoint, as a crash would; the next start replays the WAL."""
        command = [str(self.bin / "pg_ctl"), "stop", "-D", str(self.data), "-m", "immediate", "-w", "-t", "20"]
        if self.user is not None:
            command = ["runuser", "-u", self.user, "--", *command]
        subprocess.run(command, check=False, capture_output=True)
        if self.child.wait(20) is None:
            self.child.kill()

    def kill(self) -> None:
        self.child.kill()

    def remove(self) -> None:
        """kill -9 and delete the cluster's files."""
        self.child.kill()
        shutil.rmtree(self.root, ignore_errors=True)

    def url(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def admin(self, statement: str) -> None:
        """Run one statement outside a transaction (CREATE/DROP DATABASE)."""
        with psycopg.connect(self.url("postgres"), autocommit=True, connect_timeout=5) as conn:
            conn.execute(statement)  # type: ignore[arg-type]


class Redis:
    """A Redis with no persistence: a kill loses every queued Celery message, as a real crash would."""

    def __init__(self, root: Path) -> None:
        self.port = free_port()
        self.child = Child(
            "redis",
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(root),
            ],
            env=dict(os.environ),
            log_dir=root,
        )

    def start(self) -> None:
        self.child.start()
        wait_port(self.port, timeout=20, child=self.child)

    def kill(self) -> None:
        self.child.kill()

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"


class S3:
    """moto's S3 server, reached by Backfill only through the fault proxy."""

    def __init__(self, root: Path) -> None:
        self.moto_port = free_port()
        self.proxy = FaultProxy(port=free_port(), upstream_port=self.moto_port)
        self.child = Child(
            "moto",
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.moto_port)],
            env={**os.environ, **AWS_ENV},
            log_dir=root,
        )

    def start(self) -> None:
        self.child.start()
        wait_port(self.moto_port, timeout=30, child=self.child)
        self.proxy.start()

    def stop(self) -> None:
        self.proxy.close()
        self.child.kill()

    @property
    def endpoint(self) -> str:
        """The URL Backfill uses: the proxy's."""
        return f"http://127.0.0.1:{self.proxy.port}"

    def client(self) -> object:
        """A boto3 client straight to moto (the harness's own view, unaffected by the proxy)."""
        return boto3.client(
            "s3",
            endpoint_url=f"http://127.0.0.1:{self.moto_port}",
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            config=Config(retries={"max_attempts": 3, "mode": "standard"}),
        )

    def keys(self, bucket: str) -> list[str]:
        """Every object key in the bucket."""
        client = self.client()
        keys: list[str] = []
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):  # type: ignore[attr-defined]
            keys += [item["Key"] for item in page.get("Contents", [])]
        return keys


@dataclass
class Cluster:
    """Postgres + Redis + S3 for a series of runs; each run gets its own database, Redis db and bucket.

    `root` is this cluster's scratch directory; `cache` outlives it (the demo model, vLLM's compile caches).
    """

    root: Path
    cache: Path
    postgres: Postgres
    redis: Redis
    s3: S3

    @classmethod
    def start(cls, root: Path, *, cache: Path) -> Cluster:
        root.mkdir(parents=True, exist_ok=True)
        cache.mkdir(parents=True, exist_ok=True)
        for name in ("pg", "redis", "s3"):
            (root / name).mkdir(exist_ok=True)
        cluster = cls(root, cache, Postgres(root / "pg"), Redis(root / "redis"), S3(root / "s3"))
        try:
            cluster.postgres.init()
            cluster.postgres.start()
            cluster.redis.start()
            cluster.s3.start()
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def stop(self) -> None:
        self.s3.stop()
        self.redis.kill()
        self.postgres.remove()
