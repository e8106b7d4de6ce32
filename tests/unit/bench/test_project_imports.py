"""Every bench script's imports of the project resolve: the scripts import lazily (inside functions, after their
engines start), so a name that moved in a refactor fails only when that part runs, minutes into `make bench`."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[3] / "bench"
PROJECT = {"api", "bench", "client", "storage", "worker"}


def project_imports(path: Path) -> list[tuple[str, str]]:
    """(module, name) of each `from <project module> import name` anywhere in the file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] in PROJECT:
            found.extend((str(node.module), alias.name) for alias in node.names)
    return found


@pytest.mark.parametrize("script", sorted(BENCH.glob("*.py")), ids=lambda path: path.name)
def test_each_name_a_bench_script_imports_from_the_project_exists(script: Path) -> None:
    missing = []
    for module_name, name in project_imports(script):
        module = importlib.import_module(module_name)
        if not hasattr(module, name):
            try:
                importlib.import_module(f"{module_name}.{name}")
            except ModuleNotFoundError:
                missing.append(f"{module_name}.{name}")
    assert not missing, missing
