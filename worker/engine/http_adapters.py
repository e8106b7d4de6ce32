"""LoRA adapters in shared mode (docs/adapters.md, "Shared mode"): which adapters the external vLLM server has, and
loading the ones it lacks through its run-time route, so a line naming an adapter goes out with the adapter's name
as its `model`.

vLLM's server takes adapters two ways: `--lora-modules name=path` at start, and `POST /v1/load_lora_adapter`
while it runs (with `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`). Backfill's adapters are registered while everything
runs (`POST /v1/adapters`), and the server is someone else's, serving online users: restarting it for each new
adapter is not an option, so Backfill loads at run time. An adapter the server already lists from the same folder
(its `--lora-modules`, or loaded by another worker) is used as it is, without a load; one it lists under the same
name from another folder is not Backfill's adapter, and its lines fail rather than run under the wrong weights
(unless Backfill loaded it itself: a name registered again, with new files, is reloaded in place). An adapter that
cannot be loaded (the route is off, the server cannot read the folder, the files are bad) fails its own lines with
`adapter_load_failed`, never another line; the failure is remembered for `FAILURE_MEMORY_SECONDS`, so a large batch
does not ask once per line.

Runs on the HTTP engine's event loop (worker/engine/http_engine.py): one load per adapter at a time (a lock per
name), however many of its lines are sent together.
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx

from worker.engine.adapters import AdapterTally, write_zero_adapter
from worker.engine.generation import Adapter, BodyError
from worker.engine.http_wire import ServerRetry

log = logging.getLogger(__name__)

LOAD_ROUTE = "/v1/load_lora_adapter"
FAILURE_MEMORY_SECONDS = 60.0  # after this, a failed adapter is tried again (its server may have been fixed)
ZERO_ADAPTER = "backfill-zero-adapter"


class ServerAdapters:
    """The adapters a vLLM server has (by name), loading the ones it lacks."""

    def __init__(self, client: httpx.AsyncClient, base_url: str, *, path_map: Mapping[str, str]) -> None:
        self._client, self._base_url, self._path_map = client, base_url, dict(path_map)
        self.known: dict[str, str | None] = {}  # name -> the folder the server loaded it from (None: not said)
        self._ours: set[str] = set()  # names this engine loaded (it may load them again, in place)
        self._failed: dict[tuple[str, str], tuple[float, str]] = {}  # (name, folder) -> (when, why)
        self._locks: dict[str, asyncio.Lock] = {}
        self.tally = AdapterTally()

    def listed(self, cards: list[dict[str, Any]]) -> None:
        """Take the server's `/v1/models` cards: those with a `parent` are LoRA modules it already serves."""
        for card in cards:
            if card.get("parent") and isinstance(card.get("id"), str):
                self.known[card["id"]] = card.get("root") if isinstance(card.get("root"), str) else None

    def server_path(self, path: str) -> str:
        """The folder as the server sees it: the longest prefix of `path_map` that matches, replaced."""
        for prefix in sorted(self._path_map, key=len, reverse=True):
            if path == prefix or path.startswith(prefix.rstrip("/") + "/"):
                return self._path_map[prefix].rstrip("/") + path[len(prefix.rstrip("/")) :]
        return path

    def forget(self, name: str) -> None:
        """The server no longer has `name` (it answered 404 for it: restarted, or unloaded): load it again."""
        self.known.pop(name, None)

    async def ready(self, adapter: Adapter | None) -> None:
        """Return once the server serves `adapter` (None: the base, nothing to do). BodyError (`adapter_load_failed`)
        when it cannot be loaded; ServerRetry (or an httpx error) when another attempt may do better."""
        if adapter is None:
            return
        if adapter.path is None:
            raise BodyError(
                f"The adapter '{adapter.name}' is no longer registered.", code="adapter_not_found", status_code=404
            )
        folder = self.server_path(adapter.path)
        if self._serves(adapter.name, folder):
            return
        key = (adapter.name, adapter.path)
        self._raise_if_failed(key)
        async with self._locks.setdefault(adapter.name, asyncio.Lock()):
            if self._serves(adapter.name, folder):  # loaded while this call waited for the lock
                return
            self._raise_if_failed(key)
            why = await self._load(adapter.name, folder)
            if why is None:
                return
            self._failed[key] = (time.monotonic(), why)
            log.warning("LoRA adapter %s (%s) failed to load on the server: %s", adapter.name, adapter.path, why)
            raise _load_error(adapter.name, why)

    def _serves(self, name: str, folder: str) -> bool:
        return name in self.known and self.known[name] in (folder, None)

    async def _load(self, name: str, folder: str) -> str | None:
        """Ask the server to load the adapter from `folder` (as it sees it); None once it has it, else why it cannot
        (final, not retried)."""
        if name in self.known and name not in self._ours:
            return self._another(name, folder)
        body = {"lora_name": name, "lora_path": folder, "load_inplace": name in self.known}
        response = await self._client.post(f"{self._base_url}{LOAD_ROUTE}", json=body, timeout=120)
        if response.status_code == 200:
            self.known[name] = folder
            self._ours.add(name)
            self.tally.loads += 1
            return None
        message = _message(response)
        if response.status_code == 400 and "already been loaded" in message:  # loaded meanwhile, by another worker?
            listing = await self._client.get(f"{self._base_url}/v1/models", timeout=10)
            self.listed(list(_json(listing).get("data") or []))
            return None if self._serves(name, folder) else self._another(name, folder)
        if response.status_code == 404 and "error" not in _json(response):  # the route itself is absent
            return (
                "the inference server does not load adapters at run time (start it with "
                "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True and --enable-lora, or list the adapter in its --lora-modules)"
            )
        if response.status_code in (408, 429, 502, 503, 504):
            raise ServerRetry(f"HTTP {response.status_code} loading adapter {name!r}: {message[:300]}")
        # vLLM answers a folder it cannot read with 404 and files it cannot load with 500: the adapter's, not a moment's
        return f"the inference server answered HTTP {response.status_code}: {message[:400]}"

    def _another(self, name: str, folder: str) -> str:
        return (
            f"the inference server serves another adapter under the name '{name}' (from {self.known.get(name)}, not "
            f"{folder}): list it there from the same folder, or map Backfill's folders with adapter_path_map"
        )

    def _raise_if_failed(self, key: tuple[str, str]) -> None:
        failed = self._failed.get(key)
        if failed is None:
            return
        if time.monotonic() - failed[0] > FAILURE_MEMORY_SECONDS:
            del self._failed[key]
            return
        raise _load_error(key[0], failed[1])

    async def load_zero(self, base_path: str) -> str:
        """Load the zero adapter (rank 1, B = 0: worker/engine/adapters.py) base-model lines then run under, from
        a new temporary folder (mapped by `path_map`); its name, or RuntimeError naming why it could not be loaded."""
        from storage.adapters.weights import expected_shapes

        shapes = expected_shapes(base_path)
        if shapes is None:
            raise RuntimeError(f"base_lines_under_zero_adapter needs the base model's config.json at {base_path!r}")
        folder = Path(tempfile.mkdtemp(prefix="backfill-zero-lora-"))  # the server must read it: the same host
        write_zero_adapter(folder, fan_in=shapes[1]["q_proj"][0], fan_out=shapes[1]["q_proj"][1])
        body = {"lora_name": ZERO_ADAPTER, "lora_path": self.server_path(str(folder))}
        response = await self._client.post(f"{self._base_url}{LOAD_ROUTE}", json=body, timeout=120)
        # "already loaded" (by another worker): any zero adapter adds the same nothing
        if response.status_code != 200 and "already been loaded" not in _message(response):
            why = f"HTTP {response.status_code}: {_message(response)[:400]}"
            raise RuntimeError(f"the zero adapter could not be loaded on the inference server: {why}")
        return ZERO_ADAPTER


def _load_error(name: str, why: str) -> BodyError:
    return BodyError(f"The adapter '{name}' could not be loaded: {why}", code="adapter_load_failed", status_code=500)


def _json(response: httpx.Response) -> dict[str, Any]:
    try:
        found = response.json()
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def _message(response: httpx.Response) -> str:
    error = _json(response).get("error")
    if isinstance(error, dict) and error.get("message"):
        return str(error["message"])
    return response.text
