"""The public API: everything public is exported, and `__all__` is pinned in order.

`__all__` is sorted isort-style, as pyproject.toml's RUF022 note says: SCREAMING_SNAKE_CASE
constants first, then CamelCase classes, then everything else, each group in natural order
(ruff's RUF022 "isort-style" ordering).
"""

import importlib
import importlib.resources
import inspect
import re

import pytest

import langgraph_resilience

_PURE_CORES = (
    "core.canonical",
    "core.classification",
    "errors",
    "core.policy",
    "core.profile",
    "core.redaction",
    "core.backoff",
    "core.decision",
    "_graph.router",
    "_graph.retry",
    "_graph.state",
)


def _isort_key(name: str) -> tuple[int, list[int | str]]:
    if name.isupper() and len(name) > 1:
        group = 0  # SCREAMING_SNAKE_CASE constants
    elif name[:1].isupper():
        group = 1  # CamelCase classes
    else:
        group = 2  # functions and everything else
    natural = [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]
    return group, natural


def test_all_is_sorted() -> None:
    """__all__ is in isort-style order with no duplicates, so additions land in one place."""
    names = langgraph_resilience.__all__
    assert len(names) == len(set(names))
    assert names == sorted(names, key=_isort_key)


def test_isort_key_orders_constants_classes_functions() -> None:
    """The ordering rule itself: constants, then classes, then functions."""
    names = ["classify", "ToolError", "DEFAULT_RULES", "Clock", "EVENT_KEY", "add_resilience"]
    assert sorted(names, key=_isort_key) == [
        "DEFAULT_RULES",
        "EVENT_KEY",
        "Clock",
        "ToolError",
        "add_resilience",
        "classify",
    ]


@pytest.mark.parametrize("name", langgraph_resilience.__all__)
def test_every_exported_name_is_importable(name: str) -> None:
    """`from langgraph_resilience import <name>` works for every name in __all__."""
    namespace: dict[str, object] = {}
    exec(f"from langgraph_resilience import {name}", namespace)
    assert namespace[name] is getattr(langgraph_resilience, name)


def test_every_public_class_and_function_is_exported() -> None:
    """Nothing public defined in the package is left out of __all__ (every lazily
    imported name is loaded first, so none is missed for not being touched yet)."""
    for name in langgraph_resilience.__all__:
        getattr(langgraph_resilience, name)
    missing = sorted(
        name
        for name, value in vars(langgraph_resilience).items()
        if not name.startswith("_")
        and (inspect.isclass(value) or inspect.isfunction(value))
        and getattr(value, "__module__", "").startswith("langgraph_resilience")
        and name not in langgraph_resilience.__all__
    )
    assert missing == []


def test_an_unknown_name_is_an_attribute_error() -> None:
    """The lazy loader answers a typo like a plain module: AttributeError, naming it."""
    with pytest.raises(AttributeError, match="no_such_name"):
        _ = langgraph_resilience.no_such_name  # type: ignore[attr-defined]


def test_star_import_gives_exactly_all() -> None:
    """`import *` exposes exactly the documented API."""
    namespace: dict[str, object] = {}
    exec("from langgraph_resilience import *", namespace)
    assert set(namespace) - {"__builtins__"} == set(langgraph_resilience.__all__)


@pytest.mark.parametrize("module_name", _PURE_CORES)
def test_submodule_all_names_exist(module_name: str) -> None:
    """Each pure-core module's own __all__ names only things it defines or imports."""
    module = importlib.import_module(f"langgraph_resilience.{module_name}")
    missing = [name for name in module.__all__ if not hasattr(module, name)]
    assert missing == []


def test_package_has_a_docstring_and_typed_marker() -> None:
    """The package documents itself and ships py.typed for type checkers."""
    assert langgraph_resilience.__doc__
    assert langgraph_resilience.__file__ is not None
    marker = importlib.resources.files("langgraph_resilience") / "py.typed"
    assert marker.is_file()


def test_resilience_warning_is_exported_as_a_user_warning() -> None:
    """Users filter the package's warnings by one exported class, a `UserWarning`."""
    assert "ResilienceWarning" in langgraph_resilience.__all__
    assert issubclass(langgraph_resilience.ResilienceWarning, UserWarning)
