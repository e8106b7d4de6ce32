"""Schemathesis over the live OpenAPI document (issue 14): generated requests to every route, authenticated
with an admin key, never get a 5xx and every answer matches the documented status, headers and schema.

Positive and negative (schema-violating) cases, `MAX_EXAMPLES` per operation and mode, so it stays around
half a minute per backend in CI; a deeper run: `make fuzz` (BACKFILL_FUZZ_EXAMPLES=200, this file and the
line-checker properties).
"""

from __future__ import annotations

import os

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.config import SchemathesisConfig
from schemathesis.config._checks import NEGATIVE_DATA_REJECTION_EXPECTED_STATUSES

from tests.conftest import LiveServer, make_key

pytestmark = pytest.mark.backfill_env({"BACKFILL_MODELS": '{"fake-model": {"path": "fake:"}}'})
MAX_EXAMPLES = int(os.environ.get("BACKFILL_FUZZ_EXAMPLES", "4"))
# "Schema-valid data is accepted" cannot hold here: a schema cannot say that an upload must be JSONL or that
# input_file_id must name an uploaded file, so such requests rightly get 400/404. Every other check runs:
# no 5xx, documented statuses, content types, headers and bodies, schema-invalid data rejected with a 4xx.
EXCLUDED = [schemathesis.checks.positive_data_acceptance]
# A multipart file part is bytes whatever the generator meant it to be ("an object instead of a string"), so
# schema-violating uploads cannot be told from valid ones; uploads are fuzzed with valid-shaped data only.
POSITIVE_ONLY = {"POST /v1/files"}
# A schema-violating body can also be too large (e.g. more `part_ids` than `maxItems`, past the 1 MiB JSON body
# limit): the 413 api/limits.py answers, documented on every route taking a body, rejects it as rightly as a 400.
CONFIG = SchemathesisConfig.from_dict(
    {"checks": {"negative_data_rejection": {"expected-statuses": [*NEGATIVE_DATA_REJECTION_EXPECTED_STATUSES, "413"]}}}
)


def run_operation(operation: schemathesis.APIOperation, mode: GenerationMode, key: str) -> str | None:
    """Fuzz one operation; the first failure as text, or None."""

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    def fuzz(case: schemathesis.Case) -> None:
        case.call_and_validate(headers={"Authorization": f"Bearer {key}"}, excluded_checks=EXCLUDED)

    try:
        fuzz()
    except Unsatisfiable:
        return None  # no schema-violating request exists (e.g. only free-text path parameters)
    except (Exception, BaseExceptionGroup) as failure:  # a check failed: report it with the operation
        return f"{operation.label} [{mode.value}]: {str(failure)[:1500]}"
    return None


def test_generated_requests_get_documented_answers_and_no_5xx(api: LiveServer) -> None:
    key = make_key("fuzz", admin=True)
    schema = schemathesis.openapi.from_url(f"{api.base_url}/openapi.json", config=CONFIG)
    failures = []
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 10
    for operation in operations:
        modes = [GenerationMode.POSITIVE]
        if operation.label not in POSITIVE_ONLY:
            modes.append(GenerationMode.NEGATIVE)
        for mode in modes:
            failure = run_operation(operation, mode, key)
            if failure:
                failures.append(failure)
    assert not failures, "\n\n".join(failures)
