"""Redaction by the catalogue of credential formats (detect-secrets, the `secrets` extra).

Every format regex of the installed catalogue generates credentials (hypothesis'
`from_regex`, from the plugin's own denylist) that are planted in text and in JSON values
and must never come out; the entropy and keyword plugins stay out (a commit hash and a
uuid come out as they went in); no catalogue regex ever runs on more than a window of the
text, whatever the text; and without detect-secrets our own rules still stand.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import random
import re
import string
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from langgraph_resilience.core import secret_catalogue
from langgraph_resilience.core.redaction import REDACTED, redact, redact_value
from langgraph_resilience.core.secret_catalogue import LEFT_OUT, STEP, WINDOW, Format
from tests.unit.test_planted_secrets import PLANTED, leaked

MISSING = "detect-secrets is not installed (pip install 'langgraph-resilience[secrets]')"
FORMATS = secret_catalogue.formats()
SCANNED = [pytest.param(f, id=f"{f.plugin}-{i}") for i, f in enumerate(FORMATS) if not f.phrase]
HEADERS = [pytest.param(f, id=f.plugin + "-" + f.phrase) for f in FORMATS if f.phrase]
NONE = [pytest.param(None, marks=pytest.mark.skip(reason=MISSING))]

_CONTEXT = st.lists(
    st.sampled_from(
        [
            *(" ", "error:", "x", "=", ":", '"', "'", "(", "[", "{", "&", ";", ",", "@", "\n"),
            *("token:", "pwd=", "url=", "//", "://", "key", "password", "Bearer"),
        ]
    ),
    max_size=4,
).map("".join)


@pytest.fixture
def catalogue() -> Any:
    """detect-secrets itself, or a skip saying it is not installed."""
    return pytest.importorskip("detect_secrets", reason=MISSING)


@pytest.fixture
def without_catalogue(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """As if detect-secrets were not installed (its modules unimportable)."""
    for name in (
        "detect_secrets",
        "detect_secrets.core.plugins.util",
        "detect_secrets.plugins.base",
    ):
        monkeypatch.setitem(sys.modules, name, None)
    secret_catalogue._planned.cache_clear()
    yield
    monkeypatch.undo()
    secret_catalogue._planned.cache_clear()


def _secret(entry: Format, credential: str) -> str:
    """What must not come out of a match: the longest run of characters that are no
    separator in it, from its first group (detect-secrets' groups mark a secret after its
    ``key =``, or a token's prefix, as GitHub's ``(ghp|gho|...)_``) to its end."""
    match = entry.pattern.fullmatch(credential)
    assert match is not None
    starts = [match.start(g) for g in range(1, entry.pattern.groups + 1) if match.start(g) >= 0]
    runs = re.findall(r"""[^\s"'=:]+""", credential[min(starts, default=0) :])
    return max(runs, key=len, default="")


# ------------------------------------------------------------------- what is used


def test_every_format_plugin_of_the_installed_catalogue_is_used(catalogue: Any) -> None:
    """Each ``RegexBasedDetector`` of the installed detect-secrets brings all its regexes,
    but the public-IP one and basic auth (our URL rule's); the entropy and keyword
    plugins are none of them."""
    util = importlib.import_module("detect_secrets.core.plugins.util")
    base = importlib.import_module("detect_secrets.plugins.base")
    plugins = util.get_mapping_from_secret_type_to_class().values()
    expected = [
        (plugin.__name__, pattern.pattern)
        for plugin in sorted(plugins, key=lambda c: c.__name__)
        if issubclass(plugin, base.RegexBasedDetector) and plugin.__name__ not in LEFT_OUT
        for pattern in plugin.denylist
    ]
    assert [(f.plugin, f.pattern.pattern) for f in FORMATS] == expected
    used = {f.plugin for f in FORMATS}
    assert len(used) >= 20
    assert used.isdisjoint(
        {"Base64HighEntropyString", "HexHighEntropyString", "KeywordDetector", *LEFT_OUT}
    )
    assert set(LEFT_OUT) == {"IPPublicDetector", "BasicAuthDetector"}


def test_what_a_model_needs_to_see_comes_out_unchanged(catalogue: Any) -> None:
    """No entropy plugin: commit hashes, uuids, digests, addresses and ids stay."""
    text = (
        "merge 3f2a9c4e1b7d8a6f5e4c3b2a1908f7e6d5c4b3a2 failed for request "
        "123e4567-e89b-12d3-a456-426614174000 (sha256 "
        "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08) "
        "at 2026-01-01T00:00:00Z on 8.8.8.8:53 and 10.0.0.1, order ORD-2026-000123, "
        "see https://example.com/a/b?page=2&sort=desc"
    )
    assert redact(text, limit=None) == text
    assert redact_value({"commit": text, "ids": [text]}) == {"commit": text, "ids": [text]}


# --------------------------------------------------- every format, generated and planted


@pytest.mark.parametrize("entry", SCANNED or NONE)
def test_every_format_is_redacted_wherever_it_is_planted(catalogue: Any, entry: Format) -> None:
    """Credentials generated from the plugin's own regex, planted in text and in a JSON
    value, never come out of `redact` or `redact_value`."""

    @settings(
        max_examples=40,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    @given(
        credential=st.from_regex(entry.pattern, fullmatch=True),
        before=_CONTEXT,
        after=_CONTEXT,
    )
    def planted(credential: str, before: str, after: str) -> None:
        secret = _secret(entry, credential)
        text = f"{before} {credential} {after}"
        assume(len(secret) >= 8 and text.count(secret) == 1)  # distinctive, planted once
        assert secret not in redact(text, limit=None)
        assert secret not in redact(text)
        value = {"error": {"detail": [text], "note": credential}}
        assert secret not in json.dumps(redact_value(value), ensure_ascii=False)

    planted()


@pytest.mark.parametrize("entry", HEADERS or NONE)
def test_a_key_after_its_header_is_redacted_to_its_end(catalogue: Any, entry: Format) -> None:
    """A plain-phrase format (``BEGIN RSA PRIVATE KEY``, ``PuTTY-User-Key-File-2``) is a
    header: the key after it goes, to its ``END`` line (what follows stays) or, with no
    END, to the end of the text."""
    assert entry.phrase is not None
    body = "MIIEowIBAAKCAQEA3kQ9vZ1xT4pL8mN2rS5uW7yA0cE3gH6jK9lO2qR5tV8wY1zB4"
    text = f"sent ---- {entry.phrase} ----\nComment: x\n{body}\nPrivate-MAC: 1f2e3d"
    assert body not in redact(text, limit=None)
    assert body not in json.dumps(redact_value({"config": {"signing": text}}))
    if entry.phrase.startswith("BEGIN "):
        closing = "END " + entry.phrase.removeprefix("BEGIN ")
        out = redact(f"{text}\n---- {closing} ----\nwas rejected", limit=None)
        assert body not in out
        assert out.endswith("\nwas rejected")


def test_a_format_cut_by_a_window_is_redacted_to_the_end_of_its_word(catalogue: Any) -> None:
    """A credential standing across a window's edge, or longer than a window, goes whole:
    a match reaching its window's end runs on to the end of its word."""
    rng = random.Random(39)
    body = "".join(rng.choice(string.ascii_letters + string.digits) for _ in range(700))
    token = "pypi-AgEIcHlwaS5vcmc" + body  # a format of the catalogue alone
    for offset in range(0, 2 * WINDOW, 17):
        out = redact("x" * offset + " " + token + " kept", limit=None)
        assert out == "x" * offset + f" {REDACTED} kept", offset


# ------------------------------------------------------------------ bounded by structure


@dataclasses.dataclass
class Recording:
    """A catalogue regex that notes the stretch of text each run was given."""

    pattern: re.Pattern[str]
    runs: list[str]

    def finditer(self, text: str, pos: int, endpos: int) -> Iterator[re.Match[str]]:
        self.runs.append(text[pos:endpos])
        return self.pattern.finditer(text, pos, endpos)


ADVERSARIAL = {
    "slashes": "/" * 100_000,
    "npm-4096-slashes": "/" * 4096 + "/:_authToken=x",  # 54 ms for npm's regex alone
    "npm-slashes": "//a/" * 25_000,
    "npm-near-misses": ("/" * 497 + "/:_authToken=x ") * 200,
    "key-then-spaces": "ibm_key" + " " * 100_000 + "=",
    "assignments": 'sl_key = "' * 10_000,
    "openai-dashes": "sk-" * 30_000 + "T3BlbkFJ",
    "one-word": "a" * 100_000,
}


@pytest.mark.parametrize("text", ADVERSARIAL.values(), ids=ADVERSARIAL.keys())
def test_no_catalogue_regex_runs_on_more_than_a_window(
    catalogue: Any, monkeypatch: pytest.MonkeyPatch, text: str
) -> None:
    """Whatever the text, each catalogue regex (npm's is quadratic in what it is given,
    the ``key = value`` ones cubic in a run of spaces) runs on at most `WINDOW`
    characters at a time, never on two spaces in a row, and on about twice the text in
    all: bounded work per window, so linear in the text."""
    runs: list[str] = []
    recorded = tuple(
        dataclasses.replace(f, pattern=Recording(f.pattern, runs))  # type: ignore[arg-type]
        for f in FORMATS
    )
    _use(monkeypatch, recorded)
    redact(text, limit=None)
    assert max(map(len, runs), default=0) <= WINDOW
    assert not any("  " in run for run in runs)
    windows = len(text) // STEP + 1
    assert len(runs) <= windows * len(FORMATS)
    assert sum(map(len, runs)) <= windows * WINDOW * len(FORMATS)


def test_a_window_lacking_what_a_regex_needs_skips_it(
    catalogue: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """npm's regex needs ``/:_authToken=``: slashes alone never run it, one near miss
    runs it on the windows holding it."""
    runs: list[str] = []
    recorded = tuple(
        dataclasses.replace(f, pattern=Recording(f.pattern, runs))  # type: ignore[arg-type]
        if "_authToken" in f.pattern.pattern
        else f
        for f in FORMATS
    )
    assert recorded != FORMATS
    _use(monkeypatch, recorded)
    redact("/" * 100_000, limit=None)
    assert runs == []
    redact("/" * 100_000 + "/:_authToken=x", limit=None)
    assert 1 <= len(runs) <= 2


def _use(monkeypatch: pytest.MonkeyPatch, formats: tuple[Format, ...]) -> None:
    """Redact with `formats` as the catalogue for the rest of the test (the plan, cached
    per process, is made anew from them now and from the real catalogue after)."""
    secret_catalogue._planned.cache_clear()
    monkeypatch.setattr(secret_catalogue, "_catalogue", lambda: formats)
    monkeypatch.setattr(secret_catalogue, "_planned", functools.cache(_unplanned()))


def _unplanned() -> Any:
    return secret_catalogue._planned.__wrapped__  # type: ignore[attr-defined]


# ---------------------------------------------------------------- without the catalogue


@pytest.mark.usefixtures("without_catalogue")
@pytest.mark.parametrize("planted", PLANTED, ids=[p.kind for p in PLANTED])
def test_without_the_catalogue_our_rules_still_redact(planted: Any) -> None:
    """detect-secrets absent: nothing is imported, and every kind our own rules know
    (the planted-secrets table) is still redacted."""
    assert secret_catalogue.formats() == ()
    assert secret_catalogue.spans(planted.text) == []
    assert leaked(redact(planted.text, limit=None), planted) == []
    assert leaked(json.dumps(redact_value(planted.structured)), planted) == []


@pytest.mark.usefixtures("without_catalogue")
def test_without_the_catalogue_its_formats_are_unknown() -> None:
    """What only the catalogue knows passes without it (why it is worth installing)."""
    token = "pypi-AgEIcHlwaS5vcmc" + "A1b2C3d4E5" * 8
    assert redact(f"upload failed with {token}") == f"upload failed with {token}"


def test_loading_the_catalogue_leaves_the_programs_warnings_alone() -> None:
    """detect-secrets' logger turns on ``logging.captureWarnings`` when it is imported:
    the first redaction of a user's program must not send its warnings to logging."""
    if not FORMATS:
        pytest.skip(MISSING)
    program = (
        "import logging, warnings\n"
        "shown = warnings.showwarning\n"
        "from langgraph_resilience.core import secret_catalogue\n"
        "assert secret_catalogue._catalogue()\n"
        "assert warnings.showwarning is shown, warnings.showwarning\n"
        "logging.captureWarnings(True)\n"
        "logging.captureWarnings(False)\n"
        "assert warnings.showwarning is shown\n"
        "warnings.warn('still on stderr')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "UserWarning: still on stderr" in done.stderr
