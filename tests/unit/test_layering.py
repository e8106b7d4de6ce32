"""Who may import whom: api/ and worker/ import storage/; storage/ imports neither; api/ never imports
worker/; only the vLLM adapter imports vllm (so the API starts without torch)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def imports_of(package: str) -> list[tuple[str, str]]:
    found = []
    for path in sorted((ROOT / package).rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found += [(str(path.relative_to(ROOT)), alias.name) for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.append((str(path.relative_to(ROOT)), node.module))
    return found


@pytest.mark.parametrize(("package", "forbidden"), [("storage", ("api", "worker")), ("api", ("worker",))])
def test_layers_import_only_downwards(package: str, forbidden: tuple[str, ...]) -> None:
    bad = [(path, module) for path, module in imports_of(package) if module.split(".")[0] in forbidden]
    assert bad == []


def test_only_the_engine_adapter_imports_vllm() -> None:
    users = {
        path
        for package in ("api", "storage", "worker")
        for path, module in imports_of(package)
        if module.split(".")[0] in {"vllm", "torch"}
    }
    assert users <= {"worker/engine/vllm_engine.py", "worker/demo_model.py"}


def test_the_api_process_starts_without_torch() -> None:
    code = "import sys, api.app, worker.cli; api.app.create_app(); print('torch' in sys.modules, 'vllm' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert result.stdout.split() == ["False", "False"]
