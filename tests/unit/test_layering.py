"""The house rules a type checker cannot see, checked on the source tree.

Who may import whom: api/ and worker/ import storage/; storage/ imports neither; api/ never imports
worker/ (it sends tasks by name); only worker/cli/ (the composition root) imports api/; worker/engine/
imports nothing else of worker/; only the vLLM adapter imports vllm (so the API starts without torch);
client/ (the HTTP client commands) imports nothing of api/, worker/ or storage/ beyond the shared constants of
storage/protocols.py (and the settings, for the embedded server's key file). No SQL outside storage/: no SQLAlchemy statement, no `text()`, no `COPY`, no session
query call; and inside storage/, no statement that writes `batch_requests` outside storage/queue/. The
protocol seam is test_protocol_seam.py's, storage's own order test_storage_layers.py's. The worker sets no attribute of a batch
row: storage functions do (`mark_ingested`, `fail_batch`, `attach_result_file`). The runner and the slot call only what
the `Engine` protocol declares: no `getattr` on an engine.
Each rule's checker is also run on a snippet that breaks it, so a checker that stopped seeing anything
would fail here too.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def sources(package: str) -> list[tuple[str, ast.Module]]:
    return [
        (str(path.relative_to(ROOT)), ast.parse(path.read_text())) for path in sorted((ROOT / package).rglob("*.py"))
    ]


def imports_in(tree: ast.Module) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
            found += [f"{node.module}.{alias.name}" for alias in node.names]
    return found


def imports_of(package: str) -> list[tuple[str, str]]:
    return [(path, module) for path, tree in sources(package) for module in imports_in(tree)]


# -- SQL stays in storage/ -----------------------------------------------------------------------

# What code outside storage/ may take from SQLAlchemy: the Session type, for signatures.
ALLOWED_SQLALCHEMY = {"sqlalchemy.orm", "sqlalchemy.orm.Session"}
QUERY_METHODS = {"execute", "scalar", "scalars", "query", "exec_driver_sql", "copy"}
SQL_TEXT = re.compile(r"\b(COPY|SELECT|INSERT INTO|UPDATE|DELETE FROM|ANALYZE|VACUUM)\s+[a-z_(*]")


def sql_outside_storage(tree: ast.Module) -> list[str]:
    """Every SQL statement, SQLAlchemy construct or query call in a module (which must not be in storage/)."""
    found = [
        f"import {name}"
        for name in imports_in(tree)
        if name.split(".")[0] == "sqlalchemy" and name not in ALLOWED_SQLALCHEMY
    ]
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in QUERY_METHODS:
            found.append(f"line {node.lineno}: .{node.func.attr}(...)")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and SQL_TEXT.search(node.value):
            found.append(f"line {node.lineno}: SQL text {node.value[:40]!r}")
    return found


@pytest.mark.parametrize("package", ["api", "worker", "client"])
def test_no_sql_outside_storage(package: str) -> None:
    bad = {path: found for path, tree in sources(package) if (found := sql_outside_storage(tree))}
    assert bad == {}


@pytest.mark.parametrize(
    "snippet",
    [
        "from sqlalchemy import update\n",
        "from sqlalchemy import text\n",
        "def f(session):\n    session.execute(x)\n",
        "def f(cursor):\n    cursor.copy('COPY batch_requests (id) FROM STDIN')\n",
        "Q = 'UPDATE batch_requests SET status = 1'\n",
    ],
)
def test_the_sql_guard_sees_a_statement_put_back_into_worker(snippet: str) -> None:
    assert sql_outside_storage(ast.parse(snippet))


# -- storage's own rules: queue writes in storage/queue/, protocol names in storage/protocols.py -------------

QUEUE_WRITES = re.compile(r"\b(UPDATE|INSERT INTO|DELETE FROM|COPY)\s+batch_requests\b", re.I)


def writes_to_the_queue(tree: ast.Module) -> list[str]:
    """Statements that change `batch_requests` (an ORM update/insert/delete of BatchRequest, or SQL text)."""
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in {"update", "insert", "delete"}
            and node.args
            and ast.unparse(node.args[0]) == "BatchRequest"
        ):
            found.append(f"line {node.lineno}: {node.func.id}(BatchRequest)")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and QUEUE_WRITES.search(node.value):
            found.append(f"line {node.lineno}: SQL text {node.value[:40]!r}")
    return found


def test_only_storage_queue_writes_the_queue() -> None:
    bad = {
        path: found
        for path, tree in sources("storage")
        if not path.startswith("storage/queue/") and (found := writes_to_the_queue(tree))
    }
    assert bad == {}


@pytest.mark.parametrize(
    "snippet",
    [
        "def f(s):\n    s.execute(update(BatchRequest).values(status=1))\n",
        "def f(s):\n    s.execute(delete(BatchRequest))\n",
        "Q = 'COPY batch_requests (id) FROM STDIN'\n",
    ],
)
def test_the_queue_guard_sees_a_write_put_back_into_batches(snippet: str) -> None:
    assert writes_to_the_queue(ast.parse(snippet))


def batch_attribute_writes(tree: ast.Module) -> list[str]:
    """Assignments to a batch row's attributes (`batch.status = ...`): storage functions make those."""
    return [
        f"line {node.lineno}: {ast.unparse(target)}"
        for node in ast.walk(tree)
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign))
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "batch"
    ]


def test_the_worker_changes_batches_only_through_storage() -> None:
    bad = {path: found for path, tree in sources("worker") if (found := batch_attribute_writes(tree))}
    assert bad == {}
    assert batch_attribute_writes(ast.parse("batch.output_file_id = file_id\n"))


# -- request-row statuses: spelled in the lifecycle table, every move checked against it ----------------------

# The request-only statuses; the others ("completed", "failed", ...) are batch statuses too, spelled beside them.
REQUEST_ONLY_STATUSES = {"queued", "running"}
LIFECYCLE = "storage/lifecycle.py"


def request_status_spellings(tree: ast.Module) -> list[str]:
    """Request-row statuses spelled as strings, alone or quoted inside SQL text, instead of read from the table."""
    quoted = re.compile(r"'(" + "|".join(sorted(REQUEST_ONLY_STATUSES)) + r")'")
    return [
        f"line {node.lineno}: {node.value[:40]!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and (node.value in REQUEST_ONLY_STATUSES or quoted.search(node.value))
    ]


def test_request_statuses_are_spelled_only_in_the_lifecycle_table() -> None:
    bad = {
        path: found
        for package in ("api", "storage", "worker")
        for path, tree in sources(package)
        if path != LIFECYCLE and (found := request_status_spellings(tree))
    }
    assert bad == {}
    assert request_status_spellings(ast.parse("q = update(BatchRequest).where(BatchRequest.status == 'running')\n"))
    assert request_status_spellings(ast.parse("Q = \"UPDATE batch_requests SET status = 'queued'\"\n"))


def _checked_names(tree: ast.Module) -> set[str]:
    """Module-level names bound to a `request_move(...)` result (statuses checked once, at import)."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and "request_move" in ast.unparse(node.value):
            for target in node.targets:
                names |= {
                    n.id
                    for n in (target.elts if isinstance(target, ast.Tuple) else [target])
                    if isinstance(n, ast.Name)
                }
    return names


def unchecked_status_writes(tree: ast.Module) -> list[str]:
    """Functions that set `status` on `batch_requests` rows without picking them through the table
    (`lifecycle.rows_moving`, or statuses a module checked with `lifecycle.request_move`)."""
    checked = _checked_names(tree)
    found = []
    for function in ast.walk(tree):
        if not isinstance(function, ast.FunctionDef):
            continue
        calls = [node for node in ast.walk(function) if isinstance(node, ast.Call)]
        writes_queue = any(
            isinstance(call.func, ast.Name)
            and call.func.id == "update"
            and ast.unparse(call.args[:1]) == "BatchRequest"
            for call in calls
        ) or "BatchRequest.__table__" in ast.unparse(function)
        sets_status = any(
            isinstance(call.func, ast.Attribute)
            and call.func.attr == "values"
            and any(keyword.arg in {"status", None} for keyword in call.keywords)
            for call in calls
        )
        through_table = any("rows_moving" in ast.unparse(call.func) for call in calls) or any(
            isinstance(node, ast.Name) and node.id in checked for node in ast.walk(function)
        )
        if writes_queue and sets_status and not through_table:
            found.append(f"line {function.lineno}: {function.name}")
    return found


def test_every_request_status_change_goes_through_the_table() -> None:
    bad = {path: found for path, tree in sources("storage") if (found := unchecked_status_writes(tree))}
    assert bad == {}
    snippet = "def f(s):\n    s.execute(update(BatchRequest).where(BatchRequest.id == 1).values(status=REQ_QUEUED))\n"
    assert unchecked_status_writes(ast.parse(snippet))


# -- imports ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [("storage", ("api", "worker", "client")), ("api", ("worker", "client")), ("client", ("api", "worker"))],
)
def test_layers_import_only_downwards(package: str, forbidden: tuple[str, ...]) -> None:
    bad = [(path, module) for path, module in imports_of(package) if module.split(".")[0] in forbidden]
    assert bad == []


def test_only_the_composition_root_imports_the_api() -> None:
    bad = [
        (path, module)
        for path, module in imports_of("worker")
        if module.split(".")[0] == "api" and not path.startswith("worker/cli/")
    ]
    assert bad == []


# The protocols' endpoint lists, and the settings (only to find the embedded server's default key file).
CLIENT_MAY_READ = ("storage.protocols", "storage.settings")


def test_the_client_takes_only_shared_constants_from_storage() -> None:
    bad = [
        (path, module)
        for path, module in imports_of("client")
        if module.split(".")[0] == "storage" and not module.startswith(CLIENT_MAY_READ)
    ]
    assert bad == []


def test_only_the_composition_root_imports_the_client() -> None:
    bad = [
        (path, module)
        for package in ("api", "storage", "worker")
        for path, module in imports_of(package)
        if module.split(".")[0] == "client" and not path.startswith("worker/cli/")
    ]
    assert bad == []


def test_the_engine_package_imports_nothing_else_of_worker() -> None:
    bad = [
        (path, module)
        for path, module in imports_of("worker/engine")
        if module.split(".")[0] == "worker" and not module.startswith("worker.engine")
    ]
    assert bad == []


def test_only_the_engine_adapter_imports_vllm() -> None:
    users = {
        path
        for package in ("api", "storage", "worker", "client")
        for path, module in imports_of(package)
        if module.split(".")[0] in {"vllm", "torch"}
    }
    # The adapter's modules (vllm*.py, which import vLLM inside functions) and the demo models' offline builders.
    adapter = {path for path in users if re.fullmatch(r"worker/engine/(vllm\w*|demo\w*_model)\.py", path)}
    assert users - adapter == set()


def test_the_api_process_starts_without_torch() -> None:
    code = "import sys, api.app, worker.cli.main; api.app.create_app(); print('torch' in sys.modules, 'vllm' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert result.stdout.split() == ["False", "False"]


# -- the engine contract ---------------------------------------------------------------------------


def getattr_on_an_engine(tree: ast.Module) -> list[int]:
    """Lines that reach into an engine by name instead of through the Engine protocol."""
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in {"getattr", "hasattr"}
        and node.args
        and "engine" in ast.unparse(node.args[0]).lower()
    ]


def test_nothing_reaches_into_an_engine_past_its_protocol() -> None:
    bad = {
        path: lines
        for path, tree in sources("worker")
        if not path.startswith("worker/engine/") and (lines := getattr_on_an_engine(tree))
    }
    assert bad == {}
    assert getattr_on_an_engine(ast.parse("limit = getattr(self.engine, 'dispatch_limit', None)\n")) == [1]


def test_a_command_that_fails_to_import_stops_the_cli_loudly() -> None:
    code = (
        "import sys\n"
        "class Broken:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'worker.cli.plan':\n"
        "            raise ImportError('plan is broken')\n"
        "sys.meta_path.insert(0, Broken())\n"
        "from worker.cli.main import main\n"
        "sys.exit(main(['--help']))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode != 0 and "plan is broken" in result.stderr
