"""The protocol seam: the protocol names ("openai", "anthropic") are spelled only in storage/protocols.py, nothing
outside storage/ compares a batch's protocol (it asks the protocol object), and only the protocol's own modules and
the tables that list every protocol name Anthropic's at all (PROTOCOL_HOMES). Each checker is also run on a snippet
that breaks it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def sources(package: str) -> list[tuple[str, ast.Module]]:
    return [
        (str(path.relative_to(ROOT)), ast.parse(path.read_text())) for path in sorted((ROOT / package).rglob("*.py"))
    ]


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
