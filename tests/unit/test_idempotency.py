"""Idempotency keys, the ledger contract (memory, SQLite), saga compensation, partial results."""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from langgraph_resilience.core.canonical import canonical_args
from langgraph_resilience.core.compensation import (
    CompensationReport,
    acompensate_thread,
    compensate_thread,
)
from langgraph_resilience.core.effects import (
    Claim,
    EffectStatus,
    IdempotencyRecord,
    IdempotencyStore,
    SagaLog,
    claim_action,
    compensation_key,
    effect_fingerprint,
    effect_identity,
    idempotency_key,
    item_idempotency_key,
    summarize_records,
)
from langgraph_resilience.core.partial import (
    FailedItem,
    PartialResult,
    as_partial_result,
    failed_items,
)
from langgraph_resilience.errors import ThreadBusyError
from langgraph_resilience.stores.locks import thread_lock
from langgraph_resilience.stores.memory import InMemoryIdempotencyStore
from langgraph_resilience.stores.persistence import open_sqlite
from langgraph_resilience.stores.saga import InMemorySagaLog
from langgraph_resilience.stores.sqlite import SqliteIdempotencyStore
from langgraph_resilience.testing import FakeClock

ROOT = pathlib.Path(__file__).resolve().parents[2]

# ------------------------------------------------------------------ keys

KEY_CASES: list[tuple[str, Any, str, str]] = [
    ("pay", {"amount": 12.5, "currency": "EUR", "to": ["a", "b"]}, "thread-1", "msg-1:call_1"),
    ("email", {"to": {"x", "y", "z"}, "body": "héllo ✓", "n": 1e-7}, "t", "c"),
    ("order", {"items": [{"sku": 1, "qty": 2.0000001}], "nested": {"b": 1, "a": [None]}}, "", ""),
]


def test_key_has_a_pinned_format_and_value() -> None:
    """The key is `<tool>:<32 hex>` and its value never changes between releases."""
    key = idempotency_key("pay", {"amount": 5}, thread_id="t-1", call_identity="c-1")
    assert key == "pay:5be48da1272b0ea172c9d51784e47658"


def test_key_ignores_noise_order_and_float_jitter() -> None:
    """Key order, noise fields and float digits past 6 places do not change the key."""
    base = idempotency_key("pay", {"a": 1, "b": 2.0}, thread_id="t", call_identity="c")
    same = idempotency_key(
        "pay", {"b": 2.0000000001, "a": 1, "reasoning": "because"}, thread_id="t", call_identity="c"
    )
    assert base == same


@pytest.mark.parametrize(
    "change",
    [
        {"tool": "refund"},
        {"args": {"a": 2}},
        {"thread_id": "t2"},
        {"call_identity": "c2"},
    ],
    ids=["tool", "args", "thread", "call"],
)
def test_key_changes_with_each_part(change: dict[str, Any]) -> None:
    """Tool, arguments, thread and call identity each make a different key."""
    parts: dict[str, Any] = {
        "tool": "pay",
        "args": {"a": 1},
        "thread_id": "t",
        "call_identity": "c",
    }
    changed = {**parts, **change}
    assert idempotency_key(
        parts["tool"],
        parts["args"],
        thread_id=parts["thread_id"],
        call_identity=parts["call_identity"],
    ) != idempotency_key(
        changed["tool"],
        changed["args"],
        thread_id=changed["thread_id"],
        call_identity=changed["call_identity"],
    )


def test_key_parts_cannot_be_confused_by_separators() -> None:
    """A separator inside one part never makes two different calls collide."""
    a = idempotency_key("pay", {}, thread_id="t:1", call_identity="c")
    b = idempotency_key("pay", {}, thread_id="t", call_identity="1:c")
    assert a != b


def test_custom_noise_fields() -> None:
    """Callers can declare their own noise fields."""
    one = idempotency_key("pay", {"a": 1, "trace": "x"}, thread_id="t", call_identity="c")
    two = idempotency_key(
        "pay", {"a": 1, "trace": "y"}, thread_id="t", call_identity="c", noise_fields={"trace"}
    )
    three = idempotency_key(
        "pay", {"a": 1, "trace": "z"}, thread_id="t", call_identity="c", noise_fields={"trace"}
    )
    assert one != two
    assert two == three


@pytest.mark.parametrize("noise", [None, {"trace"}])
def test_effect_identity_is_the_key_the_fingerprint_and_the_stored_args(
    noise: set[str] | None,
) -> None:
    """The one-pass identity a side effect uses equals the three functions it replaces,
    with the default noise fields and with a policy's own."""
    args = {"b": 2.0, "a": "x", "trace": "t-1", "nonce": 9}
    extra: dict[str, Any] = {} if noise is None else {"noise_fields": noise}
    key, fingerprint, stored = effect_identity(
        "pay", args, thread_id="t", call_identity="m:0", **extra
    )
    assert key == idempotency_key("pay", args, thread_id="t", call_identity="m:0", **extra)
    assert fingerprint == effect_fingerprint("pay", args, thread_id="t", **extra)
    assert stored == canonical_args(args)  # the audit copy drops the default noise only


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=12,
)


@given(st.dictionaries(st.text(max_size=6), json_values, max_size=6))
def test_key_is_independent_of_dict_insertion_order(args: dict[str, Any]) -> None:
    """Property: reversing the insertion order of the arguments keeps the key."""
    reordered = dict(reversed(list(args.items())))
    assert idempotency_key("t", args, thread_id="x", call_identity="y") == idempotency_key(
        "t", reordered, thread_id="x", call_identity="y"
    )


_KEYS_IN_CHILD = """
import json, sys
from langgraph_resilience.core.effects import idempotency_key
cases = [
    ("pay", {"amount": 12.5, "currency": "EUR", "to": ["a", "b"]}, "thread-1", "msg-1:call_1"),
    ("email", {"to": {"x", "y", "z"}, "body": "héllo ✓", "n": 1e-7}, "t", "c"),
    ("order", {"items": [{"sku": 1, "qty": 2.0000001}], "nested": {"b": 1, "a": [None]}}, "", ""),
]
print(json.dumps([idempotency_key(t, a, thread_id=th, call_identity=c) for t, a, th, c in cases]))
"""


@pytest.mark.slow
def test_key_is_identical_in_two_interpreter_processes() -> None:
    """Two interpreters with different hash seeds compute the same keys (sets included)."""
    expected = [idempotency_key(t, a, thread_id=th, call_identity=c) for t, a, th, c in KEY_CASES]
    outputs = []
    for seed in ("1", "4242"):
        done = subprocess.run(
            [sys.executable, "-c", _KEYS_IN_CHILD],
            env={**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        outputs.append(json.loads(done.stdout))
    assert outputs == [expected, expected]


def test_derived_keys() -> None:
    """Compensation and item keys are derived from the call key."""
    assert compensation_key("pay:ab") == "comp:pay:ab"
    assert item_idempotency_key("bulk:ab", 2) == "bulk:ab#2"
    assert item_idempotency_key("bulk:ab", "sku-9") == "bulk:ab#sku-9"


# ------------------------------------------------------------------ the ledger contract


@pytest.fixture(params=["memory", "sqlite"])
def ledger(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> Iterator[IdempotencyStore]:
    """Each embedded backend of the ledger, fresh."""
    if request.param == "memory":
        yield InMemoryIdempotencyStore(clock=FakeClock())
        return
    conn = sqlite3.connect(
        tmp_path / "ledger.sqlite", isolation_level=None, check_same_thread=False
    )
    store = SqliteIdempotencyStore(conn, clock=FakeClock())
    store.setup()
    yield store
    conn.close()


def test_claim_new_then_pending_then_done(ledger: IdempotencyStore) -> None:
    """The first claim executes, the next finds the intent, after the outcome it replays."""
    first = ledger.claim("k", tool="pay", args_json='{"amount":5}', thread_id="t")
    second = ledger.claim("k", tool="pay", args_json='{"amount":5}', thread_id="t")
    recorded = ledger.record_outcome("k", {"id": "p_1", "items": [1, 2]})
    third = ledger.claim("k", tool="pay", args_json='{"amount":5}', thread_id="t")

    assert (first.state, second.state, third.state) == ("new", "pending", "done")
    assert second.result is None
    assert recorded.status == "done"
    assert third.result == {"id": "p_1", "items": [1, 2]}
    assert third.record.tool == "pay"
    assert third.record.args == {"amount": 5}


def test_a_recorded_result_is_stored_and_replayed_redacted(
    ledger: IdempotencyStore, tmp_path: pathlib.Path
) -> None:
    """An outcome holding secrets (a secret-named field, a password= in text, a key
    shape) is stored redacted, so the replay returns the redacted form; long text is
    not cut."""
    ledger.claim("k", tool="pay", args_json='{"amount":5}', thread_id="t")
    long = "x" * 10_000
    ledger.record_outcome(
        "k", {"id": "p_1", "token": "RcptT0k3n", "note": f"{long} password=Pw0rd77\nok"}
    )
    replay = ledger.claim("k", tool="pay", args_json='{"amount":5}', thread_id="t")
    assert replay.result == {
        "id": "p_1",
        "token": "[REDACTED]",
        "note": f"{long} password=[REDACTED]\nok",
    }
    database = tmp_path / "ledger.sqlite"
    if database.exists():
        stored = database.read_bytes()
        assert b"RcptT0k3n" not in stored
        assert b"Pw0rd77" not in stored


def test_what_a_claim_and_an_outcome_return_is_what_a_read_returns(
    ledger: IdempotencyStore,
) -> None:
    """A new claim's record and an outcome's are built from what was written (the SQL
    backends read back only the key): the same fields a read returns, secret-named
    arguments redacted, the result as JSON holds it (a tuple comes back a list)."""
    claim = ledger.claim(
        "k", tool="login", args_json='{"password":"p","user":"u"}', thread_id="t", fingerprint="f"
    )
    stored = ledger.get("k")
    assert stored is not None
    fields = ("key", "status", "tool", "thread_id", "args", "fingerprint")
    assert [getattr(claim.record, f) for f in fields] == [getattr(stored, f) for f in fields]
    assert claim.record.args == {"password": "[REDACTED]", "user": "u"}

    recorded = ledger.record_outcome("k", {"ids": (1, 2)})
    stored = ledger.get("k")
    assert stored is not None
    assert (recorded.key, recorded.status, recorded.result) == ("k", "done", {"ids": [1, 2]})
    assert recorded.result == stored.result


def test_unresolved_lists_the_thread_s_pending_intents_of_one_effect(
    ledger: IdempotencyStore,
) -> None:
    """Never another thread's, another effect's, an answered or a released one; a key
    released and claimed again is pending again (the fixture's clock stands still, so
    the order, oldest first, is not what this checks)."""

    def claim(key: str, thread: str = "t", fp: str = "F") -> None:
        ledger.claim(key, tool="pay", args_json="{}", thread_id=thread, fingerprint=fp)

    for key in ("k1", "k2", "k3", "k4", "k5"):
        claim(key)
    claim("other-thread", thread="u")
    claim("other-effect", fp="G")
    ledger.record_outcome("k2", "ok")
    ledger.record_outcome("k3", {"error": "x"}, status="failed")
    ledger.release("k1")
    ledger.release("k4")
    claim("k4")
    assert sorted(r.key for r in ledger.unresolved("t", "F")) == ["k4", "k5"]
    assert all(r.status == "pending" and r.thread_id == "t" for r in ledger.unresolved("t", "F"))
    assert [r.key for r in ledger.unresolved("u", "F")] == ["other-thread"]
    ledger.record_outcome("k5", "ok")
    ledger.record_outcome("k4", "ok")
    assert ledger.unresolved("t", "F") == []


def test_done_keys_list_the_thread_s_done_records_of_one_effect(ledger: IdempotencyStore) -> None:
    """Done only (never pending, failed or released), of this thread and fingerprint, and
    purged ones are gone: what a rewound thread is checked against."""

    def claim(key: str, thread: str = "t", fp: str = "F") -> None:
        ledger.claim(key, tool="pay", args_json="{}", thread_id=thread, fingerprint=fp)

    for key in ("k1", "k2", "k3", "k4"):
        claim(key)
    claim("other-thread", thread="u")
    claim("other-effect", fp="G")
    for key in ("k1", "k2", "other-thread", "other-effect"):
        ledger.record_outcome(key, "ok")
    ledger.record_outcome("k3", {"error": "x"}, status="failed")
    assert sorted(ledger.done_keys("t", "F")) == ["k1", "k2"]
    assert ledger.done_keys("u", "F") == ["other-thread"]
    assert ledger.done_keys("t", "nothing") == []


def test_first_outcome_wins(ledger: IdempotencyStore) -> None:
    """A recorded outcome is never overwritten; the caller learns the stored one."""
    ledger.claim("k", tool="pay", args_json="{}", thread_id="t")
    ledger.record_outcome("k", "first")
    again = ledger.record_outcome("k", "second", status="failed")
    assert (again.status, again.result) == ("done", "first")


def test_failed_outcome_replays_until_released(ledger: IdempotencyStore) -> None:
    """A failed outcome is a `done` claim with status failed; release re-arms the key."""
    ledger.claim("k", tool="pay", args_json="{}", thread_id="t")
    ledger.record_outcome("k", {"error": "declined"}, status="failed")
    replay = ledger.claim("k", tool="pay", args_json="{}", thread_id="t")
    released = ledger.release("k")
    fresh = ledger.claim("k", tool="pay", args_json="{}", thread_id="t")

    assert (replay.state, replay.status, replay.result) == ("done", "failed", {"error": "declined"})
    assert released is True
    assert fresh.state == "new"


def test_release_forgets_pending_but_never_done(ledger: IdempotencyStore) -> None:
    """A pending intent can be released (effect certainly not done); a done one cannot."""
    ledger.claim("p", tool="pay", args_json="{}", thread_id="t")
    ledger.claim("d", tool="pay", args_json="{}", thread_id="t")
    ledger.record_outcome("d", 1)

    assert ledger.release("p") is True
    assert ledger.get("p") is None
    assert ledger.release("d") is False
    assert ledger.release("never") is False
    record = ledger.get("d")
    assert record is not None
    assert record.result == 1


def test_records_by_thread_and_redacted_args(ledger: IdempotencyStore) -> None:
    """for_thread lists one thread's records; secret-named arguments are stored redacted."""
    ledger.claim("a", tool="login", args_json='{"user":"u","password":"hunter2"}', thread_id="t")
    ledger.claim("b", tool="pay", args_json="{}", thread_id="t")
    ledger.claim("c", tool="pay", args_json="{}", thread_id="other")
    ledger.record_outcome("b", None)

    records = ledger.for_thread("t")
    assert sorted(r.key for r in records) == ["a", "b"]
    by_key = {r.key: r for r in records}
    assert by_key["a"].args == {"user": "u", "password": "[REDACTED]"}
    assert summarize_records(records) == {
        "pending": 1,
        "done": 1,
        "failed": 0,
        "unknown": 0,
        "compensated": 0,
    }


def test_outcomes_must_be_json(ledger: IdempotencyStore) -> None:
    """Outcomes are JSON in every backend: anything else is refused before it is stored."""
    ledger.claim("k", tool="pay", args_json="{}", thread_id="t")
    with pytest.raises(TypeError, match="JSON-serializable"):
        ledger.record_outcome("k", object())
    with pytest.raises(TypeError, match="JSON-serializable"):
        ledger.record_outcome("k", float("nan"))
    with pytest.raises(ValueError, match="'done' or 'failed'"):
        ledger.record_outcome("k", 1, status="pending")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="JSON text"):
        ledger.claim("j", tool="pay", args_json="{not json", thread_id="t")
    assert ledger.claim("k", tool="pay", args_json="{}", thread_id="t").state == "pending"


def test_claim_is_exclusive_across_threads(ledger: IdempotencyStore) -> None:
    """12 threads claim one key together: exactly one `new`."""
    barrier = threading.Barrier(12)
    states: list[str] = []

    def claim() -> None:
        barrier.wait()
        states.append(ledger.claim("race", tool="pay", args_json="{}", thread_id="t").state)

    threads = [threading.Thread(target=claim) for _ in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(states) == ["new"] + ["pending"] * 11


async def test_async_twins(ledger: IdempotencyStore) -> None:
    """aclaim / arecord_outcome / arelease / aget / afor_thread behave like the sync methods."""
    first = await ledger.aclaim("k", tool="pay", args_json="{}", thread_id="t")
    await ledger.arecord_outcome("k", [1])
    replay = await ledger.aclaim("k", tool="pay", args_json="{}", thread_id="t")
    await ledger.aclaim("p", tool="pay", args_json="{}", thread_id="t")
    released = await ledger.arelease("p")
    record = await ledger.aget("k")
    records = await ledger.afor_thread("t")

    assert (first.state, replay.state, replay.result, released) == ("new", "done", [1], True)
    assert record is not None
    assert [r.key for r in records] == ["k"]


def test_sqlite_claims_are_exclusive_between_connections(tmp_path: pathlib.Path) -> None:
    """Two connections to one file (two processes' view): the second claim finds the intent."""
    path = tmp_path / "shared.sqlite"
    one = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    two = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        a, b = SqliteIdempotencyStore(one), SqliteIdempotencyStore(two)
        a.setup()
        assert a.claim("k", tool="pay", args_json="{}", thread_id="t").state == "new"
        assert b.claim("k", tool="pay", args_json="{}", thread_id="t").state == "pending"
        a.record_outcome("k", "ok")
        assert b.claim("k", tool="pay", args_json="{}", thread_id="t").result == "ok"
    finally:
        one.close()
        two.close()


@pytest.mark.parametrize(
    ("claim", "can_check", "action"),
    [
        (Claim("new", IdempotencyRecord("k", "pending")), False, "execute"),
        (Claim("new", IdempotencyRecord("k", "pending")), True, "execute"),
        (Claim("done", IdempotencyRecord("k", "done")), True, "replay"),
        (Claim("done", IdempotencyRecord("k", "failed")), False, "replay"),
        (Claim("pending", IdempotencyRecord("k", "pending")), True, "check_status"),
        (Claim("pending", IdempotencyRecord("k", "pending")), False, "unknown"),
    ],
)
def test_claim_action(claim: Claim, can_check: bool, action: str) -> None:
    """A pending intent is never executed blindly: status check, or unknown."""
    assert claim_action(claim, can_check_status=can_check) == action


# ------------------------------------------------------------------ saga


@pytest.fixture(params=["memory", "sqlite"])
def saga_backend(
    request: pytest.FixtureRequest, tmp_path: pathlib.Path
) -> Iterator[tuple[IdempotencyStore, SagaLog]]:
    """A ledger and a saga log on one embedded backend."""
    if request.param == "memory":
        yield InMemoryIdempotencyStore(), InMemorySagaLog()
        return
    with open_sqlite(tmp_path / "saga.sqlite") as p:
        yield p.idempotency, p.saga


@pytest.fixture(params=["sync", "async"])
def compensate(request: pytest.FixtureRequest) -> Callable[..., CompensationReport]:
    """compensate_thread, or acompensate_thread run to completion."""
    if request.param == "sync":
        return compensate_thread

    def run(thread_id: str, **kwargs: Any) -> CompensationReport:
        return asyncio.run(acompensate_thread(thread_id, **kwargs))

    return run


def _three_effects(store: IdempotencyStore, saga: SagaLog, thread: str = "t") -> None:
    for n in (1, 2, 3):
        key = f"pay:{n}"
        store.claim(key, tool="pay", args_json="{}", thread_id=thread)
        store.record_outcome(key, {"payment_id": f"p_{n}"})
        saga.append(thread, key=key, tool="pay", action="effect", status="done")


def test_compensations_run_lifo_exactly_once(
    saga_backend: tuple[IdempotencyStore, SagaLog], compensate: Callable[..., CompensationReport]
) -> None:
    """Three effects -> three compensations newest first; a rerun compensates nothing again."""
    store, saga = saga_backend
    _three_effects(store, saga)
    undone: list[tuple[str, Any]] = []

    def refund(key: str, recorded: Any) -> str:
        undone.append((key, recorded["payment_id"]))
        return f"refunded {recorded['payment_id']}"

    first = compensate("t", store=store, saga=saga, compensators={"pay": refund})
    second = compensate("t", store=store, saga=saga, compensators={"pay": refund})

    assert undone == [("pay:3", "p_3"), ("pay:2", "p_2"), ("pay:1", "p_1")]
    assert first.ok
    assert first.compensated == ["pay:3", "pay:2", "pay:1"]
    assert [s.outcome for s in second.steps] == ["already_compensated"] * 3
    assert second.steps[0].result == "refunded p_3"
    log = [(e.key, e.status) for e in saga.entries("t") if e.action == "compensate"]
    assert log == [
        ("pay:3", "started"),
        ("pay:3", "done"),
        ("pay:2", "started"),
        ("pay:2", "done"),
        ("pay:1", "started"),
        ("pay:1", "done"),
    ]


def test_failed_compensation_is_reported_and_stops(
    saga_backend: tuple[IdempotencyStore, SagaLog], compensate: Callable[..., CompensationReport]
) -> None:
    """A compensator that raises is reported (redacted), logged, and older effects wait."""
    store, saga = saga_backend
    _three_effects(store, saga)

    def refund(key: str, recorded: Any) -> str:
        if key == "pay:2":
            raise RuntimeError("refund API down token=abc123secret")
        return "ok"

    report = compensate("t", store=store, saga=saga, compensators={"pay": refund})
    again = compensate("t", store=store, saga=saga, compensators={"pay": refund})

    assert not report.ok
    assert [s.outcome for s in report.steps] == ["compensated", "failed", "not_attempted"]
    assert report.steps[1].error is not None
    assert "refund API down" in report.steps[1].error
    assert "abc123secret" not in report.steps[1].error
    assert [s.key for s in report.outstanding] == ["pay:2", "pay:1"]
    assert [s.outcome for s in again.steps] == ["already_compensated", "failed", "not_attempted"]
    assert ("pay:2", "failed") in [(e.key, e.status) for e in saga.entries("t")]


def test_failed_compensation_can_be_retried_or_skipped(
    saga_backend: tuple[IdempotencyStore, SagaLog], compensate: Callable[..., CompensationReport]
) -> None:
    """stop_on_failure=False continues past a failure; retry_failed=True runs it again."""
    store, saga = saga_backend
    _three_effects(store, saga)
    broken = {"pay:2"}
    calls: list[str] = []

    def refund(key: str, recorded: Any) -> str:
        calls.append(key)
        if key in broken:
            raise RuntimeError("down")
        return "ok"

    kept_going = compensate(
        "t", store=store, saga=saga, compensators={"pay": refund}, stop_on_failure=False
    )
    broken.clear()
    retried = compensate(
        "t", store=store, saga=saga, compensators={"pay": refund}, retry_failed=True
    )

    assert [s.outcome for s in kept_going.steps] == ["compensated", "failed", "compensated"]
    assert [s.outcome for s in retried.steps] == [
        "already_compensated",
        "compensated",
        "already_compensated",
    ]
    assert calls == ["pay:3", "pay:2", "pay:1", "pay:2"]


def test_interrupted_compensation_is_never_rerun_blindly(
    saga_backend: tuple[IdempotencyStore, SagaLog], compensate: Callable[..., CompensationReport]
) -> None:
    """A compensation claimed but unrecorded is `unknown` without a status check, never re-run."""
    store, saga = saga_backend
    _three_effects(store, saga)
    store.claim(compensation_key("pay:3"), tool="pay", args_json="{}", thread_id="t")
    calls: list[str] = []

    report = compensate(
        "t", store=store, saga=saga, compensators={"pay": lambda k, r: calls.append(k)}
    )

    assert calls == []
    assert [s.outcome for s in report.steps] == ["unknown", "not_attempted", "not_attempted"]
    assert not report.ok


@pytest.mark.parametrize(("done", "runs"), [(True, []), (False, ["pay:3"])])
def test_interrupted_compensation_is_reconciled_by_status_check(
    saga_backend: tuple[IdempotencyStore, SagaLog],
    compensate: Callable[..., CompensationReport],
    done: bool,
    runs: list[str],
) -> None:
    """The status check decides: done -> recorded without running; not done -> run once."""
    store, saga = saga_backend
    _three_effects(store, saga)
    store.claim(compensation_key("pay:3"), tool="pay", args_json="{}", thread_id="t")
    calls: list[str] = []
    asked: list[str] = []

    def refund(key: str, recorded: Any) -> str:
        calls.append(key)
        return "ran"

    def check(key: str) -> EffectStatus:
        asked.append(key)
        return EffectStatus(done=done, result="found" if done else None)

    report = compensate(
        "t", store=store, saga=saga, compensators={"pay": refund}, status_checks={"pay": check}
    )

    assert asked == ["comp:pay:3"]
    assert [c for c in calls if c == "pay:3"] == runs
    assert report.steps[0].outcome == "compensated"
    assert report.steps[0].result == ("found" if done else "ran")
    assert report.ok


def test_effects_without_compensator_are_reported_not_dropped(
    saga_backend: tuple[IdempotencyStore, SagaLog], compensate: Callable[..., CompensationReport]
) -> None:
    """An effect nobody can undo stays in the report; duplicates in the log count once."""
    store, saga = saga_backend
    saga.append("t", key="mail:1", tool="mail", action="effect", status="done")
    saga.append("t", key="pay:1", tool="pay", action="effect", status="done", detail={"id": 1})
    saga.append("t", key="mail:1", tool="mail", action="effect", status="done")
    saga.append("other", key="pay:9", tool="pay", action="effect", status="done")
    seen: list[Any] = []

    report = compensate(
        "t", store=store, saga=saga, compensators={"pay": lambda k, r: seen.append(r)}
    )

    assert [(s.key, s.outcome) for s in report.steps] == [
        ("pay:1", "compensated"),
        ("mail:1", "no_compensator"),
    ]
    assert seen == [{"id": 1}]  # no ledger record: the saga entry's detail is passed
    assert report.ok
    assert [s.key for s in report.outstanding] == ["mail:1"]


def test_async_compensators_need_the_async_runner() -> None:
    """acompensate_thread awaits async compensators; compensate_thread refuses them clearly."""
    store, saga = InMemoryIdempotencyStore(), InMemorySagaLog()
    saga.append("t", key="k", tool="pay", action="effect", status="done")

    async def refund(key: str, recorded: Any) -> str:
        await asyncio.sleep(0)
        return "async ok"

    sync_report = compensate_thread("t", store=store, saga=saga, compensators={"pay": refund})
    assert sync_report.steps[0].outcome == "failed"
    assert "acompensate_thread" in (sync_report.steps[0].error or "")
    store.release(compensation_key("k"))

    report = asyncio.run(
        acompensate_thread("t", store=store, saga=saga, compensators={"pay": refund})
    )
    assert report.steps[0].result == "async ok"


# ------------------------------------------------------------------ partial results


def test_partial_result_shape_round_trips() -> None:
    """The documented marker parses from a dict, JSON text or the model; others are None."""
    marker = {
        "partial": True,
        "succeeded": ["a"],
        "failed": [{"item": "b", "error": "503", "index": 1}],
    }
    model = PartialResult(succeeded=["a"], failed=[FailedItem(item="b", error="503", index=1)])

    assert as_partial_result(marker) == model
    assert as_partial_result(json.dumps(marker)) == model
    assert as_partial_result(model) is model
    assert PartialResult.model_validate_json(model.model_dump_json()) == model
    assert as_partial_result({"succeeded": [], "failed": []}) is None
    assert as_partial_result("plain text") is None
    assert as_partial_result(["partial"]) is None


def test_failed_items_by_index_item_and_key() -> None:
    """Only failed items are redone, in original order, each with its first-run key."""
    items = [{"sku": "a"}, {"sku": "b"}, {"sku": "c"}, {"sku": "d"}]
    partial = PartialResult(
        succeeded=[{"sku": "a"}],
        failed=[
            FailedItem(index=3, error="timeout"),
            FailedItem(item={"sku": "b"}, error="503"),
        ],
    )
    by_key = PartialResult(failed=[FailedItem(key="c", error="409")])

    redo = failed_items(items, partial, call_key="bulk:1")
    keyed = failed_items(items, by_key, call_key="bulk:1", item_key=lambda i: i["sku"])

    assert [(r.index, r.item, r.key) for r in redo] == [
        (1, {"sku": "b"}, "bulk:1#1"),
        (3, {"sku": "d"}, "bulk:1#3"),
    ]
    assert [(r.index, r.key) for r in keyed] == [(2, "bulk:1#c")]


def test_failed_items_match_equal_items_once_each() -> None:
    """Two failed copies of an equal item select two positions, not one twice."""
    items = ["x", "y", "x"]
    partial = PartialResult(
        failed=[FailedItem(item="x", error="e"), FailedItem(item="x", error="e")]
    )
    assert [r.index for r in failed_items(items, partial, call_key="k")] == [0, 2]


@pytest.mark.parametrize(
    ("failed", "message"),
    [
        (FailedItem(index=9, error="e"), "index 9"),
        (FailedItem(item="zzz", error="e"), "not in the batch"),
        (FailedItem(key="k", error="e"), "item_key="),
    ],
)
def test_failed_items_refuse_unknown_items(failed: FailedItem, message: str) -> None:
    """A partial result naming an item outside the batch is a tool bug, reported clearly."""
    with pytest.raises(ValueError, match=message):
        failed_items(["a", "b"], PartialResult(failed=[failed]), call_key="k")


# ------------------------------------------------------------------ SQLite thread lock


def test_sqlite_thread_lock_excludes_a_second_runner(tmp_path: pathlib.Path) -> None:
    """On the embedded backend a second runner of one thread gets ThreadBusyError."""
    with open_sqlite(tmp_path / "threads.sqlite") as p:
        with p.thread_lock("t1"):
            with pytest.raises(ThreadBusyError) as caught, p.thread_lock("t1"):
                pass
            with p.thread_lock("t2"):
                pass
            with pytest.raises(ThreadBusyError), p.thread_lock("t1", wait=0.02):
                pass
        with thread_lock(tmp_path / "threads.sqlite", "t1"):
            pass
    assert caught.value.thread_id == "t1"


async def test_sqlite_async_thread_lock(tmp_path: pathlib.Path) -> None:
    """athread_lock uses the same file lock as thread_lock."""
    with open_sqlite(tmp_path / "threads.sqlite") as p:
        async with p.athread_lock("t1"):
            with pytest.raises(ThreadBusyError), p.thread_lock("t1"):
                pass
        async with p.athread_lock("t1"):
            pass
