"""The house rules a type checker cannot see, checked on the source tree.

Who may import whom: api/ and worker/ import storage/; storage/ imports neither; api/ never imports
worker/ (it sends tasks by name); only worker/cli/ (the composition root) imports api/; worker/engine/
imports nothing else of worker/; only the vLLM adapter imports vllm (so the API starts without torch).
No SQL outside storage/: no SQLAlchemy statement, no `text()`, no `COPY`, no session query call. The
runner and the slot call only what the `Engine` protocol declares: no `getattr` on an engine.
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


@pytest.mark.parametrize("package", ["api", "worker"])
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


# -- imports ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("package", "forbidden"), [("storage", ("api", "worker")), ("api", ("worker",))])
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
        for package in ("api", "storage", "worker")
        for path, module in imports_of(package)
        if module.split(".")[0] in {"vllm", "torch"}
    }
    assert users <= {"worker/engine/vllm_engine.py", "worker/engine/demo_model.py"}


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
