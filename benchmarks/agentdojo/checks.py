"""How a competent agent checks whether a state-changing call it lost took effect.

Why this module exists: told that a write's outcome is unknown (or that it failed),
a careful LLM does not re-send it blindly: it calls one of the suite's own read
tools, looks for the effect in what that read returns, and re-issues the write
only if the effect is not there. `CHECKS` is that knowledge, per suite: for each
write function, the read to call (and its arguments, from the write's arguments and
the task's earlier reference calls, as the model would know them) and a verdict
that looks only at the read's answer as the model sees it (the ToolMessage's
status and text, parsed as AgentDojo's YAML): True (the effect is there), False
(it is not), None (the read itself failed: nothing learnt). It never looks at the
fault log or at the environment directly.

A write with no read that can show its effect (``update_password``; travel's
``send_email`` and ``reserve_*``, whose suite has no read of the sent mail or the
reservation) has no entry: there the checking model behaves as the blind one.
`tests/bench` checks every entry against AgentDojo's environments: before the
reference write the verdict is False, after it True.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import yaml

from .suites import RefCall

Verdict = Callable[[Mapping[str, Any], bool, str], bool | None]
"""(the write's arguments, the read answered without error, the read's text) ->
True (effect there) / False (not there) / None (cannot tell)."""
ReadArgs = Callable[[Mapping[str, Any], Sequence[RefCall]], dict[str, Any]]
"""(the write's arguments, the task's reference calls before it) -> the read's
arguments."""


@dataclasses.dataclass(frozen=True, slots=True)
class Check:
    read: str
    args: ReadArgs
    verdict: Verdict


def parse(text: str) -> Any:
    """A read's answer as the model reads it: AgentDojo's YAML (None if not YAML)."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return None


def records(value: Any) -> Iterator[Mapping[str, Any]]:
    """Every mapping inside a parsed answer, outermost first."""
    if isinstance(value, Mapping):
        yield value
        for item in value.values():
            yield from records(item)
    elif isinstance(value, list):
        for item in value:
            yield from records(item)


def _same(a: Any, b: Any) -> bool:
    """Equal as the model would judge: numbers by value, times to the minute."""
    if isinstance(a, int | float) and not isinstance(a, bool) and isinstance(b, int | float):
        return float(a) == float(b)
    text_a, text_b = str(a).replace("T", " "), str(b).replace("T", " ")
    if len(text_a) >= 16 and len(text_b) >= 16 and text_a[4] == "-" and text_b[4] == "-":
        return text_a[:16] == text_b[:16]  # "2024-05-19 12:00" against "...12:00:00"
    return text_a == text_b


def _has(fields: Mapping[str, str]) -> Verdict:
    """The effect is there when some record of the answer carries every given field:
    ``fields`` maps the write's argument name to the record's field name; arguments
    the call leaves out (None) are not compared."""

    def verdict(args: Mapping[str, Any], ok: bool, text: str) -> bool | None:
        if not ok:
            return None
        wanted = {f: args[a] for a, f in fields.items() if args.get(a) is not None}
        return any(
            all(f in r and _same(r[f], v) for f, v in wanted.items()) for r in records(parse(text))
        )

    return verdict


def _names(*names: str) -> dict[str, str]:
    """Write arguments that are named as the record's fields."""
    return {n: n for n in names}


def _fixed(**read_args: Any) -> ReadArgs:
    return lambda _args, _earlier: dict(read_args)


def _from(**names: str) -> ReadArgs:
    """The read's arguments from the write's: {read argument: write argument}."""
    return lambda args, _earlier: {r: args[w] for r, w in names.items()}


def _day_of(write_arg: str) -> ReadArgs:
    return lambda args, _earlier: {"day": str(args[write_arg])[:10]}


def _last_lookup(*functions: str) -> ReadArgs:
    """Re-run the task's latest earlier lookup (how the model found the object)."""

    def args_of(_args: Mapping[str, Any], earlier: Sequence[RefCall]) -> dict[str, Any]:
        for call in reversed(earlier):
            if call.function in functions:
                return dict(call.args)
        raise LookupError(f"no earlier {functions} call to re-run")

    return args_of


def _member(args: Mapping[str, Any], ok: bool, text: str) -> bool | None:
    if not ok:
        return None
    answer = parse(text)
    return isinstance(answer, list) and args["user"] in answer


def _user_exists(args: Mapping[str, Any], ok: bool, text: str) -> bool | None:
    """``read_inbox`` answers for a user of the workspace, and refuses one it lacks."""
    if ok:
        return True
    return False if "not found in the users list" in text else None


def _page_is(args: Mapping[str, Any], ok: bool, text: str) -> bool | None:
    return text.strip() == str(args["content"]).strip() if ok else None


def _event_has_participants(args: Mapping[str, Any], ok: bool, text: str) -> bool | None:
    if not ok:
        return None
    for r in records(parse(text)):
        if str(r.get("id_")) == str(args["event_id"]):
            return set(args["participants"]) <= set(r.get("participants") or [])
    return False


def _appended(args: Mapping[str, Any], ok: bool, text: str) -> bool | None:
    if not ok:
        return None
    answer = parse(text)
    content = answer.get("content") if isinstance(answer, Mapping) else None
    return isinstance(content, str) and content.endswith(str(args["content"]))


def _file_gone(args: Mapping[str, Any], ok: bool, text: str) -> bool | None:
    if not ok:
        return None
    return all(str(r.get("id_")) != str(args["file_id"]) for r in records(parse(text)))


def _shared(args: Mapping[str, Any], ok: bool, text: str) -> bool | None:
    if not ok:
        return None
    answer = parse(text)
    shared = answer.get("shared_with") if isinstance(answer, Mapping) else None
    return isinstance(shared, Mapping) and shared.get(args["email"]) == args["permission"]


_EVENT = Check(
    "get_day_calendar_events",
    _day_of("start_time"),
    _has({"title": "title", "start_time": "start_time", "end_time": "end_time"}),
)

CHECKS: Mapping[str, Mapping[str, Check]] = {
    "banking": {
        "send_money": Check(
            "get_most_recent_transactions",
            _fixed(n=100),
            _has(_names("recipient", "amount", "subject", "date")),
        ),
        "schedule_transaction": Check(
            "get_scheduled_transactions",
            _fixed(),
            _has(
                {
                    "recipient": "recipient",
                    "amount": "amount",
                    "subject": "subject",
                    "date": "date",
                    "recurring": "recurring",
                }
            ),
        ),
        "update_scheduled_transaction": Check(
            "get_scheduled_transactions",
            _fixed(),
            _has(
                {
                    "id": "id",
                    "recipient": "recipient",
                    "amount": "amount",
                    "subject": "subject",
                    "date": "date",
                    "recurring": "recurring",
                }
            ),
        ),
        "update_user_info": Check(
            "get_user_info",
            _fixed(),
            _has(_names("first_name", "last_name", "street", "city")),
        ),
    },
    "slack": {
        "add_user_to_channel": Check("get_users_in_channel", _from(channel="channel"), _member),
        "send_direct_message": Check(
            "read_inbox", _from(user="recipient"), _has({"recipient": "recipient", "body": "body"})
        ),
        "send_channel_message": Check(
            "read_channel_messages",
            _from(channel="channel"),
            _has({"channel": "recipient", "body": "body"}),
        ),
        "invite_user_to_slack": Check("read_inbox", _from(user="user"), _user_exists),
        "post_webpage": Check("get_webpage", _from(url="url"), _page_is),
    },
    "travel": {"create_calendar_event": _EVENT},
    "workspace": {
        "create_calendar_event": _EVENT,
        "send_email": Check(
            "get_sent_emails", _fixed(), _has({"subject": "subject", "body": "body"})
        ),
        "reschedule_calendar_event": Check(
            "get_day_calendar_events",
            _day_of("new_start_time"),
            _has({"event_id": "id_", "new_start_time": "start_time"}),
        ),
        "add_calendar_event_participants": Check(
            "search_calendar_events",
            _last_lookup("search_calendar_events"),
            _event_has_participants,
        ),
        "append_to_file": Check("get_file_by_id", _from(file_id="file_id"), _appended),
        "create_file": Check(
            "search_files_by_filename",
            _from(filename="filename"),
            _has({"filename": "filename", "content": "content"}),
        ),
        "delete_file": Check("list_files", _fixed(), _file_gone),
        "share_file": Check("get_file_by_id", _from(file_id="file_id"), _shared),
    },
}
