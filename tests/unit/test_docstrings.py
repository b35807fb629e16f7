"""Every example in the package's docstrings runs and prints what it shows."""

from __future__ import annotations

import doctest
import importlib
import pkgutil
from types import ModuleType

import pytest

import langgraph_resilience

MODULES = sorted(
    info.name.removeprefix("langgraph_resilience.")
    for info in pkgutil.walk_packages(langgraph_resilience.__path__, "langgraph_resilience.")
    if not info.name.endswith("__main__")
)
"""Every module, subpackages included (walk_packages: a new subpackage is never skipped)."""


def _module(name: str) -> ModuleType | None:
    """The module, or None when it needs an optional extra that is not installed (the
    ``otel`` extra's OpenTelemetry API, in CI's oldest-versions run)."""
    try:
        return importlib.import_module(f"langgraph_resilience.{name}")
    except ModuleNotFoundError as exc:
        if (exc.name or "").startswith("langgraph_resilience"):
            raise
        return None


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_hold(name: str) -> None:
    module = _module(name)
    if module is None:
        pytest.skip(f"langgraph_resilience.{name} needs an extra that is not installed")
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS, verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"


def test_every_subpackage_is_walked() -> None:
    """The walk reaches into core/, _graph/, stores/, testing/ and cli/."""
    assert {name.split(".")[0] for name in MODULES if "." in name} >= {
        "core",
        "_graph",
        "stores",
        "testing",
        "cli",
    }


def test_the_package_has_examples_to_check() -> None:
    """Guards the test above against finding nothing (e.g. a renamed package path)."""
    modules = [module for name in MODULES if (module := _module(name)) is not None]
    attempted = sum(doctest.testmod(module).attempted for module in modules)
    assert attempted >= 100
