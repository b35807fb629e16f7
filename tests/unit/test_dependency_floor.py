"""pyproject.toml's lower bounds are the versions CI tests as the oldest (.ci/oldest.txt).

CI installs the package with ``-c .ci/oldest.txt`` and runs the tests on those pins,
so a lower bound raised or lowered in one file and not the other would leave a floor
that nothing tests.
"""

from __future__ import annotations

import pathlib
import tomllib

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = pathlib.Path(__file__).resolve().parents[2]
OLDEST = ROOT / ".ci" / "oldest.txt"


def _project() -> dict[str, object]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        project: dict[str, object] = tomllib.load(f)["project"]
    return project


def _lower_bound(req: Requirement) -> Version | None:
    bounds = [Version(s.version) for s in req.specifier if s.operator == ">="]
    assert len(bounds) <= 1, f"{req}: more than one lower bound"
    return bounds[0] if bounds else None


def _floors() -> dict[str, Version | None]:
    deps = _project()["dependencies"]
    assert isinstance(deps, list)
    reqs = [Requirement(d) for d in deps]
    return {canonicalize_name(r.name): _lower_bound(r) for r in reqs}


def _pins() -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for raw in OLDEST.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        assert sep, f"{OLDEST.name}: {raw!r} is not name==version"
        key = canonicalize_name(name.strip())
        assert key not in pins, f"{OLDEST.name}: {key} pinned twice"
        pins[key] = Version(version.strip())
    return pins


def test_every_runtime_dependency_has_a_lower_bound() -> None:
    """Each runtime dependency states the oldest version it allows."""
    assert [name for name, floor in _floors().items() if floor is None] == []


def test_the_lower_bounds_are_the_oldest_pins() -> None:
    """The runtime dependencies and .ci/oldest.txt name the same packages at the same versions."""
    assert _floors() == _pins()


def test_no_extra_asks_for_less_than_the_runtime_floor() -> None:
    """An extra that repeats a runtime dependency states no older floor than it."""
    floors = _floors()
    extras = _project()["optional-dependencies"]
    assert isinstance(extras, dict)
    lower = []
    for extra, deps in extras.items():
        for dep in deps:
            req = Requirement(dep)
            floor, bound = floors.get(canonicalize_name(req.name)), _lower_bound(req)
            if floor is not None and bound is not None and bound < floor:
                lower.append(f"[{extra}] {dep} (the runtime floor is {floor})")
    assert lower == []
