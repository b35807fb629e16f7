"""Redaction cost on adversarial input: a hostile upstream must not stall a thread.

For each input of `ADVERSARIAL` (1 MB texts built to make backtracking patterns
quadratic: the old DSN pattern took 2.2 s for 20 KB and over 150 s for 100 KB), the
best of three wall times of `redact(text)` (the default: the text is truncated to
``DEFAULT_LIMIT`` first, then scrubbed) and of `redact(text, limit=None)` (the whole
megabyte scrubbed), and of `classify` on a 500 whose text and body are 1 MB each.
Target: the default path < 50 ms per megabyte (issue 12). Timings live here, never
in the unit tests, which check the bounded input instead.

With detect-secrets installed (the ``secrets`` extra) its catalogue of formats runs
too, and `CATALOGUE_ADVERSARIAL` aims at its regexes (npm's is quadratic in a line,
the ``key = value`` ones cubic in a run of spaces). `bounded` shows why windows: npm's
regex on one line of slashes, growing fourfold per doubling, against the same line
through `core.secret_catalogue` (windows of ``WINDOW`` characters: linear).

Run it from the repository root::

    python benchmarks/redaction.py
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from langgraph_resilience.core import secret_catalogue
from langgraph_resilience.core.classification import classify
from langgraph_resilience.core.redaction import redact
from langgraph_resilience.testing import FakeHTTPError

_MB = 1_000_000
ADVERSARIAL = {
    "a-": "a-" * (_MB // 2),  # the old DSN pattern backtracked on this: 2.2 s for 20 KB
    "a:": "a:" * (_MB // 2),
    "=": "=" * _MB,
    "nested-scheme": "a://" * (_MB // 4),
    "scheme-at-colon": "x://" + "a@a:" * (_MB // 4),
    "at": "x://a:" + "@" * _MB,
    "password-pairs": "password=a " * (_MB // 11),
    "glued-keys": "pwd:" * (_MB // 4),
    "token-words": "token=" * (_MB // 6),
    "spaces-after-a-pair": "password=x" + " " * _MB,
    "separators-after-a-pair": "password=x" + " ,a" * (_MB // 3),
    "open-quote": 'password="' + "\\a" * (_MB // 2),
    "misquoted": ("token:' password=" * (_MB // 17)),
    "jwt-dashes": "eyJ-" * (_MB // 4),
    "sk-dashes": "sk-" * (_MB // 3),
    "bearer": "bearer " * (_MB // 7),
    "pem-begins": "-----BEGIN PRIVATE KEY-----" * (_MB // 27),
    "bare-keys": "key=" * (_MB // 4),
    "keys-provided": "key provided:" * (_MB // 13),
    "key-then-spaces": "key" + " " * _MB + "=",
    "sendgrid-dots": "SG.aaaaaaaaaa" * (_MB // 13),
    "twilio-hex": "SK" + "0" * _MB,
    "google-prefixes": "AIza" * (_MB // 4),
    "stripe-prefixes": "sk_live_" * (_MB // 8),
    "sas-sigs": "sig=" * (_MB // 4),
    "flag-names": ("--" + "a" * 63 + "\t") * (_MB // 66),  # a name to its bound, no value
    "element-names": ("<" + "a" * 64 + " " + "b" * 255) * (_MB // 321),  # never closed
    "secret-elements": "<password>x" * (_MB // 11),  # its value runs to the next '<'
    "user-flags": ("-u " + "a" * 125) * (_MB // 128),  # users to their bound, no colon
    "encoded-pairs": "token%3D" + "%2F" * (_MB // 3),  # a value of escapes, to the end
    "encoded-twice": "token%253D" + "%2525" * (_MB // 5),  # each escape a '%25' run
    "encoded-runs": ("password%" + "25" * 500 + " ") * (_MB // 1010),  # no '3D' after
    "quoted-headers": "'Cookie: a' " * (_MB // 12),  # each cut rescans its line
}
"""About a megabyte each, shaped against each pattern of `core.redaction`."""

CATALOGUE_ADVERSARIAL = {
    "slashes": "/" * _MB,
    "npm-slashes": "//a/" * (_MB // 4),
    "npm-near-misses": ("/" * 497 + "/:_authToken=x ") * (_MB // 512),  # npm's worst
    "ibm-key-spaces": "ibm_key" + " " * _MB + "=",  # 534 ms (default path) uncollapsed
    "key-value-assignments": 'sl_key = "' * (_MB // 10),
    "aws-context": "aws key '" * (_MB // 9),
    "openai-dashes": ("sk-" * 160 + "T3BlbkFJ ") * (_MB // 489),
    "mailchimp-runs": ("a" * 100 + "-us") * (_MB // 103),
    "telegram-digits": ("1" * 100 + ":") * (_MB // 101),
    "discord-dots": "Maaaaaaaaaaaaaaaaaaaaaaaa." * (_MB // 26),
    "cloudant-urls": "https://a:" * (_MB // 10),
    "private-key-headers": "BEGIN EC PRIVATE KEY END EC PRIVATE KEY\n" * (_MB // 40),
}
"""About a megabyte each, shaped against the regexes of detect-secrets' catalogue."""

TARGET_MS = 50.0


def best_ms(func: Callable[[], Any], repeats: int = 3) -> float:
    """The best of `repeats` wall times of `func`, in milliseconds."""
    best = math.inf
    for _ in range(repeats):
        started = time.perf_counter()
        func()
        best = min(best, time.perf_counter() - started)
    return best * 1000


def hostile_error() -> FakeHTTPError:
    """A 500 whose message and body are a megabyte of the old worst case each."""
    error = FakeHTTPError(500, body="a-" * (_MB // 2))
    error.args = ("a-" * (_MB // 2),)
    return error


def bounded() -> None:
    """npm's regex on one line of slashes ending in a near miss, alone and in windows."""
    npm = [f for f in secret_catalogue.formats() if "_authToken" in f.pattern.pattern]
    if not npm:
        return
    print(f"\n{'npm regex, one line of':<26} {'alone ms':>11} {'windows ms':>14}")
    for size in (1024, 2048, 4096, 8192, 65536):
        line = "/" * size + "/:_authToken=x"
        alone = best_ms(lambda line=line: npm[0].pattern.search(line)) if size <= 8192 else math.nan
        windows = best_ms(lambda line=line: secret_catalogue.spans(line))
        print(f"{f'{size} slashes':<26} {alone:>11.2f} {windows:>14.2f}")


def table(inputs: dict[str, str]) -> float:
    """Print each input's times; return the worst default-path time."""
    worst = 0.0
    for name, text in inputs.items():
        default = best_ms(lambda text=text: redact(text))
        whole = best_ms(lambda text=text: redact(text, limit=None))
        worst = max(worst, default)
        print(f"{name:<26} {default:>11.2f} {whole:>14.1f}")
    return worst


def main() -> int:
    """Print the tables; exit 1 if the default path misses its target on any input."""
    formats = secret_catalogue.formats()  # imported here, not in the first timing
    plugins = len({f.plugin for f in formats})
    state = f"{len(formats)} regexes of {plugins} plugins" if formats else "not installed"
    print(f"detect-secrets catalogue: {state}\n")
    print(f"{'input':<26} {'default ms':>11} {'limit=None ms':>14}")
    worst = table(ADVERSARIAL)
    error = hostile_error()
    classified = best_ms(lambda: classify(error, tool="search"))
    print(f"{'classify(1 MB 500)':<26} {classified:>11.2f}")
    if formats:
        print(f"\n{'catalogue input':<26} {'default ms':>11} {'limit=None ms':>14}")
        worst = max(worst, table(CATALOGUE_ADVERSARIAL))
        bounded()
    verdict = "ok" if worst < TARGET_MS else "MISS"
    print(f"\nworst default redaction: {worst:.2f} ms (target < {TARGET_MS:g} ms): {verdict}")
    return 0 if worst < TARGET_MS else 1


if __name__ == "__main__":
    raise SystemExit(main())
