"""Tool modules: `load_module` gives exactly the tools a module defines, even when another module
the process imported (the demo's, say) uses the same names; one module cannot define a name twice."""

from __future__ import annotations

import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from pyworker import tools

MODULE = """
from pyworker.tools import tool

@tool(input_schema={{"type": "object"}}, description="{label} send", effect="non_idempotent")
def send_email(idempotency_key: str) -> str:
    return "{label}:" + idempotency_key

@tool(input_schema={{"type": "object"}}, effect="pure")
async def {extra}() -> str:
    '''{label} extra.

    More words.'''
    return "{label}"
"""


def write_module(root: Path, label: str, extra: str) -> str:
    name = f"toolmod_{label}_{uuid.uuid4().hex[:8]}"
    (root / f"{name}.py").write_text(textwrap.dedent(MODULE.format(label=label, extra=extra)))
    return name


@pytest.fixture
def module_dir(tmp_path: Path):
    sys.path.insert(0, str(tmp_path))
    yield tmp_path
    sys.path.remove(str(tmp_path))


async def test_each_module_gets_exactly_its_own_tools(module_dir: Path) -> None:
    first = tools.load_module(write_module(module_dir, "one", "only_in_one"))
    second = tools.load_module(write_module(module_dir, "two", "only_in_two"))
    assert sorted(first.tools) == ["only_in_one", "send_email"]
    assert sorted(second.tools) == ["only_in_two", "send_email"]
    assert await first.get("send_email").call({}, "k") == "one:k"  # type: ignore[union-attr]
    assert await second.get("send_email").call({}, "k") == "two:k"  # type: ignore[union-attr]
    assert second.get("only_in_two").description == "two extra."  # type: ignore[union-attr]
    assert second.get("send_email").effect == "non_idempotent"  # type: ignore[union-attr]
    # The default registry keeps the first module's send_email (or an earlier import's).
    assert tools.registry.get("send_email").fn.__module__ != second.get("send_email").fn.__module__  # type: ignore[union-attr]
    assert tools.load_module(second.get("send_email").fn.__module__) is second  # type: ignore[union-attr]


def test_one_module_cannot_define_a_name_twice(module_dir: Path) -> None:
    name = f"toolmod_dup_{uuid.uuid4().hex[:8]}"
    (module_dir / f"{name}.py").write_text(
        "from pyworker.tools import tool\n"
        "@tool('same', input_schema={'type': 'object'})\n"
        "def a() -> None: ...\n"
        "@tool('same', input_schema={'type': 'object'})\n"
        "def b() -> None: ...\n"
    )
    with pytest.raises(ValueError, match="tool 'same' is already registered"):
        tools.load_module(name)


def test_a_module_without_tools_and_a_missing_module_are_clear_errors(module_dir: Path) -> None:
    name = f"toolmod_empty_{uuid.uuid4().hex[:8]}"
    (module_dir / f"{name}.py").write_text("X = 1\n")
    with pytest.raises(ValueError, match="defines no tools"):
        tools.load_module(name)
    with pytest.raises(ValueError, match="cannot import tools module 'no_such_tools_module'"):
        tools.load_module("no_such_tools_module")
