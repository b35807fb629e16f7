"""The credential formats of a maintained catalogue: detect-secrets' plugins, when installed.

`core.redaction`'s own rules know the shapes we keep by hand; the formats of every other
provider come from Yelp's detect-secrets (``pip install "langgraph-resilience[secrets]"``):
each of its plugins that is a ``RegexBasedDetector`` brings its ``denylist`` regexes, read
from the installed library, never copied here. Without detect-secrets `spans` finds
nothing and our own rules stand alone.

Left out on purpose: the entropy plugins (they are no ``RegexBasedDetector``: they flag
commit hashes and uuids a model needs to see), the keyword plugin (neither: our
``key=value`` rules cover it) and `LEFT_OUT` (a public IP address is no secret; our URL
rule redacts a URL's password better than the basic-auth plugin).

What a match redacts: from its first group (a group marks the secret after a ``key =``,
or a token's prefix) to the end of its word, since a format may stop short of the key
(24 characters of a longer Stripe key, a JWT without its signature). A plain phrase
(``BEGIN RSA PRIVATE KEY``) is a header: the key after it goes, to its END or to the end.
The catalogue runs before `core.redaction`'s own rules: those may redact part of what a
format needs around its secret (``token: "cl_key"]="..."``) and hide the rest from it.

The catalogue was written for scanning files line by line, not for hostile text: npm's
regex is quadratic in the length of a line, and the ``key = value`` ones (`` *`` next to
`` +``) cubic in a run of spaces. So no catalogue regex ever runs on more than `WINDOW`
characters: the text, each run of spaces made one, is scanned in windows of `WINDOW`
characters, one every `STEP` (a format up to `STEP` long lies whole in some window, a
longer one is followed to the end of its word), and a window lacking the literal a
regex needs (npm's ``/:_authToken=``) skips it. Bounded work per window: linear in all.
"""

from __future__ import annotations

import bisect
import functools
import importlib
import logging
import re
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["LEFT_OUT", "STEP", "WINDOW", "Format", "formats", "spans"]

WINDOW = 512
"""The most characters one catalogue regex is run on at a time."""

STEP = WINDOW // 2
"""How far apart windows start: a match up to this long is seen whole in some window."""

LEFT_OUT = {
    "IPPublicDetector": "a public IP address is no credential: a model needs it to say "
    "which host failed",
    "BasicAuthDetector": "core.redaction's URL rule does better: the password runs to the "
    "URL's last '@' (a raw '@' in it included), and the user and host stay",
}
"""``RegexBasedDetector`` plugins not used, and why."""

_WORD_REST = re.compile(r"[A-Za-z0-9_\-+/=]*+")
_REPEATS = frozenset({"MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"})


@dataclass(frozen=True)
class Format:
    """One regex of the catalogue, with what lets a window skip it cheaply."""

    plugin: str
    """The detect-secrets plugin class it comes from (``"StripeDetector"``)."""
    pattern: re.Pattern[str]
    needs: frozenset[str]
    """Lower-cased literals one of which every match contains (empty: no such literal)."""
    shortest: int
    """The fewest characters a match can have."""
    phrase: str | None
    """The pattern's text when it is a plain phrase (``BEGIN RSA PRIVATE KEY``): a header
    that the key follows, which `spans` redacts to its ``END`` or to the end of the text."""


def formats() -> tuple[Format, ...]:
    """The catalogue's credential formats, or ``()`` when detect-secrets is not installed.

    Imported on the first call (not with the package): the library takes ~0.1 s to load.
    """
    plan = _planned()
    return () if plan is None else plan.catalogue


def _catalogue() -> tuple[Format, ...]:
    shown = warnings.showwarning
    try:
        from detect_secrets.core.plugins.util import (  # noqa: PLC0415 (lazy: the extra)
            get_mapping_from_secret_type_to_class,
        )
        from detect_secrets.plugins.base import RegexBasedDetector  # noqa: PLC0415
    except ImportError:
        return ()
    finally:
        _keep_warnings(shown)
    found: list[Format] = []
    mapping: dict[str, type[Any]] = get_mapping_from_secret_type_to_class()
    plugins = sorted(mapping.values(), key=lambda c: c.__name__)
    for plugin in plugins:
        if not issubclass(plugin, RegexBasedDetector) or plugin.__name__ in LEFT_OUT:
            continue  # the entropy and keyword plugins are no RegexBasedDetector
        denylist: Iterable[Any] = getattr(plugin, "denylist", ())
        found += [
            _format(plugin.__name__, pattern)
            for pattern in denylist
            if isinstance(pattern, re.Pattern) and isinstance(pattern.pattern, str)
        ]
    return tuple(found)


def _keep_warnings(shown: Any) -> None:
    """Undo what importing detect-secrets does to the whole process: its logger calls
    ``logging.captureWarnings(True)``, which would send every warning of the user's
    program to the ``py.warnings`` logger from the first redaction on."""
    if warnings.showwarning is not shown:
        logging.captureWarnings(False)
        warnings.showwarning = shown


def _format(plugin: str, pattern: re.Pattern[str]) -> Format:
    try:  # the regex's own parse tree: which literals it needs and how short it can be
        parsed = importlib.import_module("re._parser").parse(pattern.pattern, pattern.flags)
        items = list(parsed)
        shortest = max(1, int(parsed.getwidth()[0]))
    except Exception:  # another interpreter: no shortcuts, every window is scanned
        return Format(plugin, pattern, frozenset(), 1, None)
    needs = _needs(items) or frozenset()
    plain = all(str(op) == "LITERAL" for op, _ in items) and not pattern.flags & re.IGNORECASE
    phrase = "".join(chr(code) for _, code in items) if items and plain else None
    return Format(plugin, pattern, needs, shortest, phrase)


def _needs(items: list[tuple[Any, Any]]) -> frozenset[str] | None:
    """Literals (lower-cased) one of which every match of the parsed sequence contains;
    None when there is none to be sure of. The longest such set wins."""
    best: frozenset[str] | None = None
    run: list[str] = []

    def better(found: frozenset[str] | None) -> None:
        nonlocal best
        if found and (best is None or min(map(len, found)) > min(map(len, best))):
            best = found

    for op, arg in [*items, (None, None)]:
        name = str(op)
        if name == "LITERAL":
            run.append(chr(arg).lower())
            continue
        if run:
            better(frozenset({"".join(run)}))
            run = []
        if name == "SUBPATTERN":
            better(_needs(list(arg[-1])))
        elif name == "ATOMIC_GROUP":
            better(_needs(list(arg)))
        elif name in _REPEATS and arg[0] >= 1:
            better(_needs(list(arg[2])))
        elif name == "BRANCH":
            options = [_needs(list(option)) for option in arg[1]]
            if all(options):
                better(frozenset().union(*(o for o in options if o)))
    return best


def spans(text: str) -> list[tuple[int, int]]:
    """Where the catalogue finds a credential in `text`: sorted, merged ``(start, end)``.

    A match counts from its first group (the secret, not the ``key =`` before it) to the
    end of its word.
    """
    plan = _planned()
    if plan is None or len(text) < plan.least:
        return []
    view, moved, shift = _collapsed(text)
    found: list[tuple[int, int]] = []
    for phrase in plan.phrases:
        if phrase in view:
            found += _headers(view, phrase)
    found += _scan(view, plan)
    if moved:  # back to the positions of `text`
        found = [(_back(at, moved, shift), _back(stop, moved, shift)) for at, stop in found]
    return _merged(found)


@dataclass(frozen=True)
class _Plan:
    """The catalogue arranged for `spans`: a short text skips what cannot fit in it."""

    catalogue: tuple[Format, ...]
    phrases: tuple[str, ...]
    scanned: tuple[Format, ...]
    """The formats that are no phrase, the shortest first."""
    shortest: tuple[int, ...]
    """Their `Format.shortest`, in the same order."""
    least: int
    """The fewest characters any format matches."""


@functools.cache
def _planned() -> _Plan | None:
    """The catalogue read from detect-secrets and arranged for `spans`, once per
    process (None without detect-secrets)."""
    catalogue = _catalogue()
    if not catalogue:
        return None
    scanned = tuple(sorted((f for f in catalogue if f.phrase is None), key=lambda f: f.shortest))
    return _Plan(
        catalogue=catalogue,
        phrases=tuple(f.phrase for f in catalogue if f.phrase is not None),
        scanned=scanned,
        shortest=tuple(f.shortest for f in scanned),
        least=min(f.shortest for f in catalogue),
    )


def _scan(text: str, plan: _Plan) -> list[tuple[int, int]]:
    found: list[tuple[int, int]] = []
    start, size = 0, len(text)
    while True:
        end = min(start + WINDOW, size)
        window = text[start:end]
        lowered = window.lower() if window.isascii() else None  # else no skipping
        fitting = bisect.bisect_right(plan.shortest, end - start)
        for index in range(fitting):
            entry = plan.scanned[index]
            if lowered is not None and entry.needs and not any(n in lowered for n in entry.needs):
                continue
            matches = entry.pattern.finditer(text, start, end)
            found.extend(_secret(m) for m in matches if m.end() > m.start())
        if end == size:
            return _to_word_ends(text, found)
        start += STEP


def _to_word_ends(text: str, found: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Each span run on to the end of its word: a format may be shorter than the key
    (``rk_live_`` and 24 characters of a longer key, a JWT without its signature), and a
    window may cut a long key. One pass from left to right, so linear: a span ending
    inside a word already followed ends where that word does."""
    extended: list[tuple[int, int]] = []
    followed_from = followed_to = -1
    for at, stop in sorted(found, key=lambda span: span[1]):
        if not followed_from <= stop < followed_to:
            word = _WORD_REST.match(text, stop)
            followed_from, followed_to = stop, word.end() if word else stop
        extended.append((at, max(stop, followed_to)))
    return extended


_SPACES = re.compile(r"  +")


def _collapsed(text: str) -> tuple[str, list[int], list[int]]:
    """`text` with each run of spaces made one space, and where that moved what follows:
    the catalogue's ``key = value`` regexes put `` *`` next to `` +`` (``ibm_key`` and a
    window of spaces after it cost them half a second); on single spaces they cannot.

    Returns the text, the positions in it after which characters moved, and by how much.
    """
    if "  " not in text:
        return text, [], []
    parts: list[str] = []
    moved: list[int] = []
    shift: list[int] = []
    pos = removed = 0
    for run in _SPACES.finditer(text):
        parts += [text[pos : run.start()], " "]
        removed += len(run.group()) - 1
        moved.append(run.start() - (removed - (len(run.group()) - 1)) + 1)
        shift.append(removed)
        pos = run.end()
    return "".join(parts) + text[pos:], moved, shift


def _back(at: int, moved: list[int], shift: list[int]) -> int:
    index = bisect.bisect_right(moved, at) - 1
    return at + shift[index] if index >= 0 else at


def _secret(match: re.Match[str]) -> tuple[int, int]:
    """The match from its first group on: a group marks the secret after a ``key =`` or a
    URL's user, or only the prefix of a token (GitHub's ``(ghp|gho|...)_``), so nothing
    after the first group is left."""
    starts = [match.start(g) for g in range(1, match.re.groups + 1) if match.start(g) >= 0]
    return (min(starts, default=match.start()), match.end())


def _headers(text: str, phrase: str) -> list[tuple[int, int]]:
    """A key's header, and the key after it: to the line of its ``END`` (``BEGIN X`` ends
    at ``END X``) or, with no END, to the end of the text."""
    found: list[tuple[int, int]] = []
    closing = "END " + phrase[len("BEGIN ") :] if phrase.startswith("BEGIN ") else None
    at = text.find(phrase)
    while at >= 0:
        stop = text.find(closing, at + len(phrase)) if closing else -1
        if stop < 0:
            found.append((at, len(text)))
            break
        line_end = text.find("\n", stop)
        stop = len(text) if line_end < 0 else line_end
        found.append((at, stop))
        at = text.find(phrase, stop)
    return found


def _merged(found: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for at, stop in sorted(found):
        if merged and at <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], stop))
        else:
            merged.append((at, stop))
    return merged
