"""The package uses LangGraph and LangChain through their public API only: no private
module, no private name of another's object, no private config key, no monkeypatched
method of a user's object, no mutated builder internals. LangGraph ships weekly, and each
of those breaks silently (an AST check of every module)."""

from __future__ import annotations

import ast
import inspect
import pathlib
from collections.abc import Iterator

from langchain_core.language_models import BaseChatModel
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import StateGraph
from langgraph.store.base import BaseStore

import langgraph_resilience

PACKAGE = pathlib.Path(langgraph_resilience.__file__).parent

NAMEDTUPLE_API = frozenset({"_replace", "_asdict", "_fields", "_make"})
"""Underscored by design, public by documentation."""

EXTENSION_POINTS = frozenset({"_get_ls_params"})
"""LangChain's hook every chat model implements; `resilient_model` forwards it to the
model it wraps, as a wrapper must."""

MUTATORS = frozenset({"add", "discard", "remove", "pop", "clear", "update", "setdefault"})
BUILDER_PARTS = frozenset({"edges", "branches", "nodes", "channels", "waiting_edges"})


def _modules() -> Iterator[tuple[pathlib.Path, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path, ast.parse(path.read_text(), filename=str(path))


def _defined(tree: ast.Module) -> set[str]:
    """Names a module defines itself (functions, classes, attributes it sets)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def _own(base: ast.expr) -> bool:
    """`self.x`, `cls.x`, `super().x`: an object's own attribute."""
    if isinstance(base, ast.Name):
        return base.id in ("self", "cls")
    return (
        isinstance(base, ast.Call) and isinstance(base.func, ast.Name) and base.func.id == "super"
    )


def _public_methods(*classes: type) -> set[str]:
    return {
        name
        for cls in classes
        for name, value in inspect.getmembers(cls)
        if not name.startswith("_") and callable(value)
    }


USER_OBJECT_METHODS = _public_methods(
    BaseCheckpointSaver, StateGraph, BaseTool, BaseChatModel, BaseStore, Runnable
)
"""Methods of the objects users hand us: replacing one on an instance is monkeypatching."""


def _violations() -> list[str]:
    found: list[str] = []
    for path, tree in _modules():
        found += _violations_in(str(path.relative_to(PACKAGE.parent)), tree)
    return found


def _violations_in(where: str, tree: ast.Module) -> list[str]:
    found: list[str] = []
    ours = _defined(tree)
    for node in ast.walk(tree):
        line = f"{where}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            parts = node.module.split(".")
            if parts[0] not in {"__future__", "langgraph_resilience"} and any(
                p.startswith("_") for p in parts
            ):
                found.append(f"{line} imports the private module {node.module}")
        elif isinstance(node, ast.Attribute):
            name = node.attr
            private = name.startswith("_") and not name.startswith("__")
            allowed = NAMEDTUPLE_API | EXTENSION_POINTS
            if private and not _own(node.value) and name not in ours | allowed:
                found.append(f"{line} touches the private name {ast.unparse(node)}")
            if (
                isinstance(node.ctx, ast.Store)
                and name in USER_OBJECT_METHODS
                and not _own(node.value)
            ):
                found.append(f"{line} replaces the method {ast.unparse(node)}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value.startswith("__pregel") or node.value == "checkpoint_map":
                found.append(f"{line} reads LangGraph's private config key {node.value!r}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            if (
                node.func.attr in MUTATORS
                and isinstance(owner, ast.Attribute)
                and owner.attr in BUILDER_PARTS
                and not _own(owner.value)
            ):
                found.append(f"{line} mutates builder internals: {ast.unparse(node.func)}")
    return found


def test_the_package_uses_public_langgraph_api_only() -> None:
    """Every private name, key, monkeypatch or builder mutation the check finds."""
    assert _violations() == []


def test_the_check_finds_what_it_looks_for() -> None:
    """The check is not vacuous: each kind of touch in a module is reported."""
    source = (
        "from langgraph._internal._constants import CONF\n"
        "def f(saver, builder, config):\n"
        "    saver._cursor()\n"
        "    saver.put = print\n"
        "    builder.edges.discard(('a', 'b'))\n"
        "    return config['configurable']['__pregel_checkpointer']\n"
    )
    found = _violations_in("m.py", ast.parse(source))
    assert [f.split(" ", 1)[1].split(" ")[0:2] for f in found] == [
        ["imports", "the"],
        ["replaces", "the"],
        ["mutates", "builder"],
        ["touches", "the"],
        ["reads", "LangGraph's"],
    ]
