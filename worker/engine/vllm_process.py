"""What an in-process vLLM engine needs of its process before vLLM is imported (no vLLM import here).

`set_env_defaults` sets the variables vLLM reads at import (in-process engine, no usage stats, every core, a
KV cache size CPU start-up insists on); `forget_import_tracebacks` lets the first engine of a process be freed;
`close_at_exit` lets a process whose engine core is a child process exit.
"""

from __future__ import annotations

import atexit
import os
import sys
import weakref
from collections.abc import Callable
from typing import Any

from storage.registry import ModelSpec


def set_env_defaults(spec: ModelSpec) -> None:
    """vLLM reads these at import; a deployment's own values win."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process: step() runs the model
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    if spec.kv_cache_memory_bytes is None:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; without it CPU start-up refuses


def forget_import_tracebacks() -> None:
    """Drop the tracebacks of ImportErrors vLLM keeps in module globals (e.g. a missing torchcodec).

    Such a traceback pins every frame on the stack when vLLM was first imported, this engine's `__init__`
    (and `self`) included, so the first engine of a process could never be freed on a model switch.
    """
    for name, module in list(sys.modules.items()):
        if name.startswith("vllm") and module is not None:
            for value in list(vars(module).values()):
                if isinstance(value, BaseException):
                    value.__traceback__ = None


def close_at_exit(engine: Any) -> Callable[[], None]:
    """Close `engine` (its `close()`, unless `closed`) when the process exits, if it is still alive then.

    A multiprocess engine core (`VLLM_ENABLE_V1_MULTIPROCESSING=1`, a deployment's choice) is a child process that
    stops only when told. vLLM tells it from a `weakref.finalize`, whose exit hook runs after multiprocessing's when
    vLLM was imported after multiprocessing; multiprocessing's joins the child first, forever (`backfill serve`
    hung on SIGTERM). A hook registered now runs before both. Held weakly: a closed engine can still be freed.
    """
    ref = weakref.ref(engine)

    def close() -> None:
        alive = ref()
        if alive is not None and not alive.closed:
            alive.close()

    atexit.register(close)
    return close
