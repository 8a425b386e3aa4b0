"""The package layout is the architecture: each subpackage imports only the floors below it.

db is the floor; the worker stands on db; the agent on the worker; HTTP on db; the fake Messages
API on nothing (a test double the worker and the agent never see); demo and CLI on top. The
deprecated shims (pyworker.tools, pyworker.demo_tools, pyworker.handlers.echo) must be the new
modules themselves, not copies.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "pyworker"

# subpackage -> the other subpackages it may import
ALLOWED = {
    "db": set(),
    "worker": {"db"},
    "agent": {"db", "worker"},
    "fake": set(),
    "http": {"db", "worker", "agent"},
    "demo": {"db", "worker", "agent", "fake"},
    "cli": {"db", "worker", "agent", "fake", "http", "demo"},
}


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
            if node.module == "pyworker":
                names += [f"pyworker.{alias.name}" for alias in node.names]
        else:
            continue
        found |= {name.split(".")[1] for name in names if name.startswith("pyworker.")}
    return found


@pytest.mark.parametrize("subpackage", sorted(ALLOWED))
def test_a_subpackage_imports_only_the_floors_below_it(subpackage: str) -> None:
    offences = [
        f"{path.relative_to(PACKAGE.parent)} imports pyworker.{target}"
        for path in sorted((PACKAGE / subpackage).rglob("*.py"))
        for target in sorted(_imports(path) - ALLOWED[subpackage] - {subpackage})
    ]
    assert offences == []


def test_every_subpackage_says_what_lives_there_and_who_may_import_it() -> None:
    for subpackage in ALLOWED:
        doc = ast.get_docstring(ast.parse((PACKAGE / subpackage / "__init__.py").read_text()))
        assert doc and "import" in doc.lower(), f"pyworker/{subpackage}/__init__.py needs its docstring"


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("pyworker.tools", "pyworker.agent.tools"),
        ("pyworker.demo_tools", "pyworker.demo.tools"),
        ("pyworker.handlers.echo", "pyworker.worker.echo"),
    ],
)
def test_deprecated_paths_are_the_new_modules(old: str, new: str) -> None:
    assert importlib.import_module(old) is importlib.import_module(new)


def test_the_default_handler_path_still_loads() -> None:
    from pyworker.agent.loop import handle
    from pyworker.worker.handler import load_handler

    assert load_handler("pyworker.agent:handle") is handle
