"""The AgentDojo evaluation's own invariants (benchmarks/agentdojo), on its quick variant.

These check the harness, not the scores: with no faults every contender solves
every task (so the replay model, the tools and AgentDojo's grading fit together),
commit timeouts really commit, faults are deterministic, and the command runs
end to end. Skipped unless the ``bench`` extra is installed.
"""

from __future__ import annotations

import json
import pathlib
import sys

import pytest

pytest.importorskip(
    "agentdojo",
    reason="the AgentDojo evaluation needs the bench extra: pip install -e '.[bench]'",
)

ROOT = pathlib.Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.agentdojo.__main__ import main, self_check  # noqa: E402
from benchmarks.agentdojo.contenders import CONTENDERS  # noqa: E402
from benchmarks.agentdojo.faults import MIXES  # noqa: E402
from benchmarks.agentdojo.replay import BEHAVIOURS, ID_STYLES  # noqa: E402
from benchmarks.agentdojo.runner import Unit, cached_suite, run_unit  # noqa: E402
from benchmarks.agentdojo.suites import verify_side_effects  # noqa: E402

SUITE = "banking"


@pytest.mark.parametrize("ids", ID_STYLES)
@pytest.mark.parametrize("contender", list(CONTENDERS))
def test_without_faults_every_contender_solves_every_task(contender: str, ids: str) -> None:
    results = run_unit(Unit(SUITE, 0, "clean", ids, (contender,)))  # type: ignore[arg-type]
    assert len(results) == len(cached_suite(SUITE).tasks)
    bad = [r for r in results if not r.success or r.duplicates or r.missed or r.raised]
    assert bad == []
    reference = sum(len(t.calls) for t in cached_suite(SUITE).tasks)
    assert sum(r.tool_executions for r in results) == reference
    assert sum(r.llm_calls for r in results) == reference + len(results)  # + final answers


def test_commit_timeouts_commit_so_plain_toolnode_duplicates() -> None:
    results = run_unit(Unit(SUITE, 0, "commit", "unique", ("toolnode",)))
    assert sum(r.faults.get("commit_timeout", 0) for r in results) > 0
    assert sum(r.duplicates for r in results) > 0


def test_before_sending_faults_never_duplicate() -> None:
    results = run_unit(Unit(SUITE, 0, "transient", "unique", ("toolnode",)))
    assert sum(sum(r.faults.values()) for r in results) > 0
    assert sum(r.duplicates for r in results) == 0


def test_faults_are_deterministic_per_attempt() -> None:
    mix = MIXES["transient+commit"]
    draws = [
        mix.draw(seed=s, suite="banking", task="t", function="f", key="{}", attempt=a)
        for s in range(40)
        for a in (1, 2, 3)
    ]
    again = [
        mix.draw(seed=s, suite="banking", task="t", function="f", key="{}", attempt=a)
        for s in range(40)
        for a in (1, 2, 3)
    ]
    assert draws == again
    assert any(draws)
    assert any(d is None for d in draws)
    transient = MIXES["transient"]
    for s in range(40):  # both mixes fault the same attempts (common random numbers)
        a = mix.draw(seed=s, suite="b", task="t", function="f", key="{}", attempt=1)
        b = transient.draw(seed=s, suite="b", task="t", function="f", key="{}", attempt=1)
        assert (a is None) == (b is None)
    first = run_unit(Unit(SUITE, 3, "transient+commit", "unique", ("toolnode",)))
    second = run_unit(Unit(SUITE, 3, "transient+commit", "unique", ("toolnode",)))
    assert [(r.faults, r.success, r.duplicates) for r in first] == [
        (r.faults, r.success, r.duplicates) for r in second
    ]


def test_the_side_effect_list_matches_what_changes_the_banking_environment() -> None:
    check = verify_side_effects(cached_suite(SUITE))
    assert check.unlisted_changers == frozenset()
    assert check.listed_unchanged == frozenset()


def test_self_check_passes() -> None:
    assert self_check([SUITE], None) == []


def test_quick_command_runs_and_writes_json(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--quick", "--limit", "4", "--jobs", "1", "--mix", "transient+commit", "refusals"]
    assert main([*argv, "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "transient+commit" in printed
    assert max(len(line) for line in printed.splitlines()) <= 100
    payload = json.loads((tmp_path / "agentdojo-eval.json").read_text())
    rows = {(r["contender"], r["mix"], r["ids"], r["behaviour"]) for r in payload["rows"]}
    assert len(rows) == len(CONTENDERS) * 2 * len(ID_STYLES) * len(BEHAVIOURS)
    assert len(payload["results"]) == 4 * len(rows)
