"""The only place in ``local_server`` that speaks HTTP: jar downloads and health probes.

This is infrastructure traffic (a Maven repository, the server's ``/health``), not
the Conductor API, so it does not go through :mod:`conductor_agents._wire.transport`
and its retry policy. Every call has bounded connect and read timeouts.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TextIO

import requests

from .._common.clock import SYSTEM_CLOCK, Clock
from ..errors import JarDownloadError

_CONNECT_TIMEOUT = 10.0
_READ_TIMEOUT = 60.0
_CHUNK = 1 << 20
_MB = 1024 * 1024


def fetch_sha1(url: str) -> str:
    """Return the hex SHA-1 digest published at ``url`` (a Maven ``.sha1`` file).

    Raises:
        JarDownloadError: the file is missing, unreachable or not a SHA-1 digest.
    """
    try:
        response = requests.get(url, timeout=(_CONNECT_TIMEOUT, _READ_TIMEOUT))
    except requests.RequestException as err:
        raise JarDownloadError(f"cannot fetch {url}: {err}") from err
    if response.status_code == 404:
        raise JarDownloadError(f"not found (HTTP 404): {url}; is this version published there?")
    if response.status_code != 200:
        raise JarDownloadError(f"cannot fetch {url}: HTTP {response.status_code}")
    # Maven .sha1 files hold the digest, sometimes followed by a file name.
    words = response.text.split()
    digest = words[0].lower() if words else ""
    if len(digest) != 40 or any(c not in "0123456789abcdef" for c in digest):
        raise JarDownloadError(f"{url} does not hold a SHA-1 digest: {response.text[:80]!r}")
    return digest


def download(
    url: str,
    dest: Path,
    *,
    label: str,
    deadline: float,
    progress: TextIO | None = None,
    clock: Clock = SYSTEM_CLOCK,
) -> str:
    """Stream ``url`` into ``dest`` (created or truncated) and return its hex SHA-1.

    ``label`` names the file in progress lines. ``deadline`` is a ``clock.monotonic()``
    value; each read also has its own timeout.
    ``progress``, when given, receives percentage and megabyte lines.

    Raises:
        JarDownloadError: HTTP error status, network failure or deadline passed.
    """
    sha1 = hashlib.sha1(usedforsecurity=False)  # the checksum Maven publishes beside the jar
    try:
        with requests.get(url, stream=True, timeout=(_CONNECT_TIMEOUT, _READ_TIMEOUT)) as response:
            if response.status_code == 404:
                raise JarDownloadError(f"not found (HTTP 404): {url}")
            if response.status_code != 200:
                raise JarDownloadError(f"cannot download {url}: HTTP {response.status_code}")
            total = int(response.headers.get("Content-Length") or 0)
            report = _Progress(progress, label, total, clock)
            with open(dest, "wb") as out:
                for chunk in response.iter_content(chunk_size=_CHUNK):
                    if clock.monotonic() > deadline:
                        raise JarDownloadError(f"download of {url} did not finish in time")
                    out.write(chunk)
                    sha1.update(chunk)
                    report.advance(len(chunk))
            report.done()
    except requests.RequestException as err:
        raise JarDownloadError(f"cannot download {url}: {err}") from err
    return sha1.hexdigest()


class _Progress:
    """Prints ``name: 42% (190.1/436.5 MB)`` at most once a second. Not thread-safe."""

    def __init__(self, stream: TextIO | None, name: str, total: int, clock: Clock) -> None:
        self._stream = stream
        self._name = name
        self._total = total
        self._clock = clock
        self._seen = 0
        self._last = -1.0

    def advance(self, size: int) -> None:
        self._seen += size
        now = self._clock.monotonic()
        if self._stream is not None and now - self._last >= 1.0:
            self._last = now
            self._print()

    def done(self) -> None:
        if self._stream is not None:
            self._print()
            self._stream.write("\n")
            self._stream.flush()

    def _print(self) -> None:
        assert self._stream is not None
        seen_mb = self._seen / _MB
        if self._total:
            pct = 100.0 * self._seen / self._total
            line = f"Downloading {self._name}: {pct:3.0f}% ({seen_mb:.1f}/{self._total / _MB:.1f} MB)"
        else:
            line = f"Downloading {self._name}: {seen_mb:.1f} MB"
        self._stream.write("\r" + line)
        self._stream.flush()


def probe_health(base_url: str, timeout: float = 2.0) -> bool:
    """Return True when ``GET {base_url}/health`` answers ``{"healthy": true}``."""
    try:
        response = requests.get(f"{base_url}/health", timeout=(timeout, timeout))
        return response.status_code == 200 and response.json().get("healthy") is True
    except (requests.RequestException, ValueError, AttributeError):
        return False

