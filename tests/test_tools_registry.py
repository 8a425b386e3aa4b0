"""Tool modules: `load_module` gives exactly the tools a module defines, even when another module
the process imported (the demo's, say) uses the same names; one module cannot define a name twice."""

from __future__ import annotations

import asyncio
import sys
import textwrap
import threading
import uuid
from pathlib import Path

import pytest

from pyworker.agent import tools

MODULE = """
from pyworker.agent.tools import tool

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
        "from pyworker.agent.tools import tool\n"
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


def test_a_tool_opts_in_to_the_cancel_signal_by_declaring_cancel() -> None:
    into = tools.ToolRegistry()

    @tools.tool(input_schema={"type": "object"}, into=into, cancel_grace=2.5)
    async def cooperative(cancel: asyncio.Event) -> bool:
        return cancel.is_set()

    @tools.tool(input_schema={"type": "object"}, into=into)
    def plain() -> str:
        return "plain"

    co, pl = into.get("cooperative"), into.get("plain")
    assert co is not None and pl is not None
    assert (co.wants_cancel, co.cancel_grace, pl.wants_cancel, pl.cancel_grace) == (True, 2.5, False, 10.0)
    assert isinstance(co.new_cancel_signal(), asyncio.Event)
    assert isinstance(pl.new_cancel_signal(), threading.Event)  # sync tools run in a thread
    signal = co.new_cancel_signal()
    signal.set()
    assert asyncio.run(co.call({}, "k", signal)) is True
    assert asyncio.run(co.call({}, "k")) is False  # a signal of its own when none is given


@pytest.mark.parametrize("grace", [0, -1, 3601, float("nan"), float("inf"), "5", True])
def test_cancel_grace_must_be_a_positive_number_of_seconds(grace: object) -> None:
    with pytest.raises(ValueError, match="cancel_grace must be"):
        tools.tool(input_schema={"type": "object"}, cancel_grace=grace)  # type: ignore[arg-type]


def test_a_model_argument_cannot_be_named_cancel() -> None:
    schema = {"type": "object", "properties": {"cancel": {"type": "boolean"}}}
    with pytest.raises(ValueError, match="the parameter `cancel` receives the stop signal"):

        @tools.tool(input_schema=schema, into=tools.ToolRegistry())
        def cancel_order(cancel: bool) -> None: ...


@pytest.mark.parametrize("name", ["get weather", "", "n" * 129, "tool.v2", "outil_\u00e9t\u00e9"])
def test_a_tool_name_the_api_refuses_fails_at_import(name: str) -> None:
    with pytest.raises(ValueError, match="must be 1 to 128 letters, digits, '_' or '-'"):

        @tools.tool(name, input_schema={"type": "object"}, into=tools.ToolRegistry())
        def t() -> None: ...


def test_a_name_of_128_letters_digits_underscores_and_dashes_is_taken() -> None:
    reg = tools.ToolRegistry()
    name = ("get_weather-2" * 10)[:128]

    @tools.tool(name, input_schema={"type": "object"}, into=reg)
    def t() -> None: ...

    assert reg.get(name) is not None
