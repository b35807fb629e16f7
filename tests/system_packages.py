"""Debian packages a test needs (PgBouncer, Redis), installed by the test under CI.

The README's test command runs on a fresh machine with ``CI=true`` and nothing that
only ``.ci/run`` prepares, so a test that needs a server from the package registry
installs it there (``apt-get install``, as root). On a user's machine nothing is
installed: the caller skips with the reason.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess

__all__ = ["binary", "installed"]

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def binary(name: str) -> str | None:
    """`name` on the PATH, or in /usr/sbin (Debian puts daemons there, off a user's PATH)."""
    found = shutil.which(name)
    if found is None and os.access(f"/usr/sbin/{name}", os.X_OK):
        found = f"/usr/sbin/{name}"
    return found


@functools.cache
def installed(name: str, package: str) -> str | None:
    """`name`'s path; under CI, as root, ``apt-get install`` `package` first when it is
    missing (with ``apt-get update`` if the lists are stale). None when it stays missing."""
    found = binary(name)
    if found is not None or not IN_CI or os.geteuid() != 0 or shutil.which("apt-get") is None:
        return found
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-q", package]
    if subprocess.run(install, env=env, capture_output=True, check=False).returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, check=False)
        subprocess.run(install, env=env, capture_output=True, check=False)
    return binary(name)
