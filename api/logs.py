"""Access logs without secrets: API keys are redacted from every logged URL and message.

uvicorn logs each request's path with its query string; a key put in a URL (`/finance?key=sk-bf-...`) would
land in the log and everywhere logs go. `RedactSecrets` rewrites `key=`/`api_key=` query values and any
`sk-...` token in a record before a handler sees it; `uvicorn_log_config` installs it on uvicorn's loggers.
"""

from __future__ import annotations

import copy
import logging
import re
from typing import Any

REDACTED = "[REDACTED]"
_QUERY_SECRET = re.compile(r"(?i)([?&;](?:api_key|key|access_token|token)=)[^&;#\s\"]*")
_BEARER_TOKEN = re.compile(r"\bsk-[A-Za-z0-9_\-]{8,}")


def redact(text: str) -> str:
    """`text` with secret query values and API-key-shaped tokens replaced."""
    return _BEARER_TOKEN.sub("sk-" + REDACTED, _QUERY_SECRET.sub(r"\1" + REDACTED, text))


class RedactSecrets(logging.Filter):
    """Redact secrets from a record's message and string arguments (never drops a record)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(redact(arg) if isinstance(arg, str) else arg for arg in record.args)
        elif isinstance(record.args, dict):
            record.args = {name: redact(v) if isinstance(v, str) else v for name, v in record.args.items()}
        return True


def uvicorn_log_config() -> dict[str, Any]:
    """uvicorn's own logging config with `RedactSecrets` on its access and error loggers."""
    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    config.setdefault("filters", {})["redact_secrets"] = {"()": "api.logs.RedactSecrets"}
    for name in ("uvicorn.access", "uvicorn.error"):
        config["loggers"].setdefault(name, {})["filters"] = ["redact_secrets"]
    return config
