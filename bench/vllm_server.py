"""A real `vllm.entrypoints.openai.api_server` as a child process: the benchmarks' and tests' online server.

`start` runs it with priority scheduling on a free port and waits for /health; `stop` ends its whole
process group. Two settings matter on a small CPU machine (docs/shared-mode.md):

- it gets its own process group (to stop it as a whole) but NOT its own session: with Linux's autogroup
  scheduling every session is one CPU share, and a server in a session of its own starved its HTTP front
  end (its engine-core process busy-polls the worker) while batch work kept the engine busy: online chats
  then arrived in one lump seconds late (TTFT p50 141-469 ms against 18-23 ms in the same session);
- it does not inherit the in-process engine's settings (`VLLM_ENABLE_V1_MULTIPROCESSING=0`,
  `VLLM_CPU_NUM_OF_RESERVED_CPU=0`): a server keeps vLLM's reserved core for its front end.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

_IN_PROCESS_ONLY = ("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_CPU_NUM_OF_RESERVED_CPU")


class ServerFailed(RuntimeError):
    """The server exited or did not become healthy; the message ends with its log."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start(
    model_dir: Path,
    *,
    served_name: str,
    max_num_seqs: int,
    max_model_len: int,
    log: Path,
    ready_seconds: float = 300,
    extra_args: Sequence[str] = (),
    extra_env: Mapping[str, str] | None = None,
) -> tuple[subprocess.Popen[bytes], str]:
    """Start the server and wait until it answers /health; return the process and its base URL. `extra_args` and
    `extra_env` add to its command line and environment (e.g. `--enable-lora`)."""
    import httpx

    port = free_port()
    command = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        *("--model", str(model_dir), "--served-model-name", served_name, "--host", "127.0.0.1", "--port", str(port)),
        *("--dtype", "float32", "--enforce-eager", "--max-model-len", str(max_model_len)),
        *("--max-num-seqs", str(max_num_seqs), "--scheduling-policy", "priority"),
        *extra_args,
    ]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_NO_USAGE_STATS": "1", **(extra_env or {})}
    for name in _IN_PROCESS_ONLY:
        env.pop(name, None)
    with log.open("wb") as out:
        proc = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, process_group=0)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + ready_seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServerFailed(f"the vLLM server exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    stop(proc)
    raise ServerFailed(f"the vLLM server was not healthy after {ready_seconds:.0f} s:\n{log.read_text()[-3000:]}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the server's process group, SIGKILL it if it has not gone after 30 s."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
