"""The house rules a type checker cannot see, checked on the source tree.

Who may import whom: api/ and worker/ import storage/; storage/ imports neither; api/ never imports
worker/ (it sends tasks by name); only worker/cli/ (the composition root) imports api/; worker/engine/
imports nothing else of worker/; only the vLLM adapter imports vllm (so the API starts without torch);
client/ (the HTTP client commands) imports nothing of api/, worker/ or storage/ beyond the shared constants of
storage/protocols.py (and the settings, for the embedded server's key file). No SQL outside storage/: no SQLAlchemy statement, no `text()`, no `COPY`, no session
query call; and inside storage/, no statement that writes `batch_requests` outside storage/queue/. The
protocol names ("openai", "anthropic") are spelled only in storage/protocols.py, and nothing outside
storage/ compares a batch's protocol: it asks the protocol object. The worker sets no attribute of a batch
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


PROTOCOL_NAMES = {"openai", "anthropic"}


def protocol_spellings(tree: ast.Module, *, outside_storage: bool) -> list[str]:
    """Protocol names spelled as strings, and (outside storage/) comparisons of a batch's protocol."""
    found = [
        f"line {node.lineno}: {node.value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.lower() in PROTOCOL_NAMES
    ]
    if outside_storage:
        found += [
            f"line {node.lineno}: {ast.unparse(node)}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Compare)
            and any(
                isinstance(side, ast.Attribute) and side.attr == "protocol" for side in [node.left, *node.comparators]
            )
        ]
    return found


def test_protocol_names_live_in_the_protocol_module() -> None:
    bad = {
        path: found
        for package in ("api", "storage", "worker")  # client/ has no protocol column ("openai" is its SDK there)
        for path, tree in sources(package)
        if path != "storage/protocols.py"
        and (found := protocol_spellings(tree, outside_storage=not path.startswith("storage/")))
    }
    assert bad == {}


@pytest.mark.parametrize(
    "snippet", ["one_model = batch.protocol == OPENAI\n", "if protocol == 'anthropic':\n    pass\n"]
)
def test_the_protocol_guard_sees_a_comparison_put_back_into_ingest(snippet: str) -> None:
    assert protocol_spellings(ast.parse(snippet), outside_storage=True)


# The modules that may name the Anthropic protocol (anywhere: code, comments, file names): its own folders, the
# tables that list every protocol (storage's, the API's, the wire formats' dispatch, the app's routers) and the
# settings (its limits' variable names). Every other module asks the protocol object.
PROTOCOL_HOMES = {
    "api/anthropic/",
    "api/app.py",
    "api/dialects.py",
    "storage/batches/message_batches.py",
    "storage/lines/anthropic.py",
    "storage/protocols.py",
    "storage/settings.py",
    "worker/engine/wire/__init__.py",
    "worker/engine/wire/anthropic/",
}
PROTOCOL_WORDS = re.compile(r"anthropic|message_batch|msgbatch", re.I)


def protocol_mentions(root: Path = ROOT) -> set[str]:
    """Files of api/, storage/, worker/ and client/ (code and static assets) naming the Anthropic protocol."""
    return {
        str(path.relative_to(root))
        for package in ("api", "storage", "worker", "client")
        for path in (root / package).rglob("*")
        if path.is_file()
        and "__pycache__" not in path.parts
        and (
            PROTOCOL_WORDS.search(str(path.relative_to(root))) or PROTOCOL_WORDS.search(path.read_text(errors="ignore"))
        )
    }


def outside_protocol_homes(paths: set[str]) -> set[str]:
    return {path for path in paths if not any(path == home or path.startswith(home) for home in PROTOCOL_HOMES)}


def test_only_the_protocols_own_modules_name_it() -> None:
    assert outside_protocol_homes(protocol_mentions()) == set()


def test_the_protocol_homes_guard_sees_a_mention_put_back(tmp_path: Path) -> None:
    (tmp_path / "api").mkdir()
    (tmp_path / "api" / "errors.py").write_text("if anthropic.is_anthropic(request):\n    pass\n")
    (tmp_path / "api" / "app.py").write_text("from api.anthropic import message_batches\n")
    assert outside_protocol_homes(protocol_mentions(tmp_path)) == {"api/errors.py"}


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


# -- storage's own order: STORAGE_LAYERS, lowest first -------------------------------------------------

# Each storage module sits in one layer, named by its path under storage/ (the longest entry that is the module
# or one of its packages wins); it imports only from its own layer and those below. docs/architecture.md says
# why each layer sits where it does. A few pure leaves sit below their folder: the planner's arithmetic (the
# registry sizes models with it) and the event counters (anything may count; metrics' scrape-time readers sit
# on top).
STORAGE_LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "base",
        (
            "clock",
            "errors",
            "ids",
            "endpoints",
            "paging",
            "strict",
            "metrics.events",
            "planning.node",
            "planning.step_time",
            "planning.roofline",
            "registry",
            "settings",
            "windows",
            "wakeups",
        ),
    ),
    ("lines", ("lines",)),
    ("core", ("protocols", "db", "models", "webhooks", "tenants", "lifecycle", "quotas")),
    ("files", ("files",)),
    ("planning", ("planning",)),
    ("finance", ("finance",)),
    ("queue", ("queue",)),
    ("batches", ("batches",)),
    ("metrics", ("metrics",)),
)


def storage_modules(root: Path = ROOT) -> dict[str, ast.Module]:
    """Every module of storage/ by its dotted name under storage/ (a package by its folder's name)."""
    modules = {}
    for path in sorted((root / "storage").rglob("*.py")):
        parts = path.relative_to(root / "storage").with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if name:
            modules[name] = ast.parse(path.read_text())
    return modules


def layer_of(module: str) -> int:
    """The index in STORAGE_LAYERS of a storage module (its longest matching entry); KeyError if none."""
    matches = [
        (len(entry), index)
        for index, (_, entries) in enumerate(STORAGE_LAYERS)
        for entry in entries
        if module == entry or module.startswith(entry + ".")
    ]
    if not matches:
        raise KeyError(f"storage.{module} is in no layer of STORAGE_LAYERS")
    return max(matches)[1]


def storage_imports(tree: ast.Module, known: set[str]) -> set[str]:
    """The storage modules a module imports, wherever the import stands: one inside a function or under
    `if TYPE_CHECKING:` is still an arrow (the reader has to know that module to follow this one)."""
    targets = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [
                f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}"[8:] in known else node.module
                for alias in node.names
            ]
        for name in names:
            if not name.startswith("storage."):
                continue
            name = name[len("storage.") :]
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name:
                targets.add(name)
    return targets


def import_graph(modules: dict[str, ast.Module]) -> dict[str, set[str]]:
    """Each module's arrows to the other storage modules."""
    known = set(modules)
    return {module: storage_imports(tree, known) - {module} for module, tree in modules.items()}


def upward_imports(modules: dict[str, ast.Module]) -> list[str]:
    """Imports (anywhere in a module) from a module of a higher layer."""
    return sorted(
        f"storage.{module} ({STORAGE_LAYERS[layer_of(module)][0]}) -> storage.{target} "
        f"({STORAGE_LAYERS[layer_of(target)][0]})"
        for module, targets in import_graph(modules).items()
        for target in targets
        if layer_of(target) > layer_of(module)
    )


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan): each is an import loop."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph.get(node, ()):
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


def test_every_storage_module_has_a_layer() -> None:
    unplaced = []
    for module in storage_modules():
        try:
            layer_of(module)
        except KeyError:
            unplaced.append(module)
    assert unplaced == []


def test_storage_imports_only_its_own_layer_and_those_below() -> None:
    assert upward_imports(storage_modules()) == []


def test_storage_has_no_import_loop() -> None:
    assert import_cycles(import_graph(storage_modules())) == []


def test_the_layer_guard_sees_an_upward_import_even_inside_a_function() -> None:
    modules = {
        "lifecycle": ast.parse("def f():\n    from storage.queue.claim import claim\n"),
        "queue.claim": ast.parse("from storage.lifecycle import transition\n"),
    }
    assert upward_imports(modules) == ["storage.lifecycle (core) -> storage.queue.claim (queue)"]


def test_the_loop_guard_sees_a_loop_even_through_a_type_only_or_deferred_import() -> None:
    modules = {
        "queue.a": ast.parse("from storage.queue.b import x\n"),
        "queue.b": ast.parse("def f():\n    import storage.queue.c\n"),
        "queue.c": ast.parse("from storage.queue import a\n"),
        "models": ast.parse("from storage.protocols import OPENAI\n"),
        "protocols": ast.parse("if TYPE_CHECKING:\n    from storage.models import Batch\n"),
        "db": ast.parse("from storage.models import Base\n"),
    }
    assert sorted(import_cycles(import_graph(modules))) == [["models", "protocols"], ["queue.a", "queue.b", "queue.c"]]
