"""storage/'s own order: every module in one layer of STORAGE_LAYERS (lowest first), importing only from its own
layer and those below, and no import loop among storage modules. Each guard is also run on a snippet that breaks
it. docs/draw_layers.py draws the figure from the same declaration and graph.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


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
            "json_values",
            "metrics.events",
            "planning.node",
            "planning.step_time",
            "planning.roofline",
            "registry",
            "settings",
            "outbound_settings",
            "windows",
            "wakeups",
            "batch_endings",
        ),
    ),
    ("lines", ("lines",)),
    ("core", ("protocols", "db", "models", "webhooks", "tenants", "lifecycle", "quotas")),
    ("files", ("files",)),
    ("adapters", ("adapters",)),  # LoRA adapters: the registry reads the files an adapter was uploaded as
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
