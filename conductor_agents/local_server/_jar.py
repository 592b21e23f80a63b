"""Finding the Conductor server jar: an explicit path, the cache, or a verified download.

Order: ``CONDUCTOR_SERVER_JAR`` (a path, used as is) → the cache
(``<cache>/conductor-server-<version>-boot.jar``) → a download, with ``mvn`` when it is
on PATH, else over HTTPS from ``CONDUCTOR_AGENTS_MAVEN_REPOSITORY``. A download lands in
a hidden temporary file in the cache directory and is renamed into place only after
its SHA-1 matched the published one, so the cache never holds a partial jar. A lock
file keeps two processes from downloading the same version at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import re
import shutil
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Union

import attrs

from .._common.clock import SYSTEM_CLOCK, Clock
from ..errors import ConfigurationError, JarDownloadError
from . import _dirs, _http, _maven

_log = logging.getLogger("conductor_agents.local_server")

DEFAULT_SERVER_VERSION = "3.32.3"
"""The server version used when neither an argument nor ``CONDUCTOR_SERVER_VERSION`` names one."""

SERVER_VERSION_ENV = "CONDUCTOR_SERVER_VERSION"
SERVER_JAR_ENV = "CONDUCTOR_SERVER_JAR"
MAVEN_REPOSITORY_ENV = "CONDUCTOR_AGENTS_MAVEN_REPOSITORY"
"""Base URL of Maven Central or your mirror (Maven2 layout), for downloads without ``mvn``."""

DEFAULT_DOWNLOAD_TIMEOUT = 1800.0

_VERSION_RE = re.compile(r"^[0-9][0-9A-Za-z.+_-]*$")
_LOCK_POLL_SECONDS = 0.5

PathLike = Union[str, "os.PathLike[str]"]


def server_version(version: str | None = None, environ: Mapping[str, str] | None = None) -> str:
    """Return the server version to use: the argument, else ``CONDUCTOR_SERVER_VERSION``, else the pin.

    Raises:
        ConfigurationError: the version is not a plain version string.
    """
    env = os.environ if environ is None else environ
    variable = None if version else SERVER_VERSION_ENV
    chosen = version or env.get(SERVER_VERSION_ENV, "") or DEFAULT_SERVER_VERSION
    if not _VERSION_RE.match(chosen):
        raise ConfigurationError(f"not a server version: {chosen!r}", variable=variable)
    return chosen


def resolve_server_jar(
    version: str | None = None,
    cache_dir: PathLike | None = None,
    *,
    progress: bool = True,
    environ: Mapping[str, str] | None = None,
    maven_repo: PathLike | None = None,
    timeout: float = DEFAULT_DOWNLOAD_TIMEOUT,
    clock: Clock = SYSTEM_CLOCK,
) -> Path:
    """Return the path of the server boot jar, downloading and verifying it on a cache miss.

    ``version`` defaults to ``CONDUCTOR_SERVER_VERSION``, then :data:`DEFAULT_SERVER_VERSION`.
    ``cache_dir`` defaults to ``CONDUCTOR_AGENTS_CACHE_DIR``, then
    ``$XDG_CACHE_HOME/conductor-agents``. ``progress`` prints one line of download progress
    (what, where, size) to standard error; Maven's own output goes to
    ``<cache>/<jar>.maven.log``, kept (and its tail put in the error) only when it failed. ``maven_repo`` is the Maven
    local repository ``mvn`` should use (default: the one in ``~/.m2/settings.xml``, else ``~/.m2/repository``).
    ``timeout`` bounds the whole download including waiting for another process's.
    ``environ`` replaces ``os.environ`` (for tests). Safe to call from several threads
    and processes at once.

    Raises:
        ConfigurationError: ``CONDUCTOR_SERVER_JAR`` names no file, or a bad version or URL.
        JarDownloadError: the download failed, failed its checksum, or there is no way to download.
    """
    env = os.environ if environ is None else environ
    explicit = env.get(SERVER_JAR_ENV, "")
    if explicit:
        path = Path(explicit).expanduser()
        if not path.is_file():
            raise ConfigurationError(f"{SERVER_JAR_ENV}={explicit} is not a file", variable=SERVER_JAR_ENV)
        return path.resolve()
    chosen = server_version(version, env)
    cache = Path(cache_dir).expanduser() if cache_dir is not None else _dirs.cache_dir(env)
    target = cache / _maven.jar_file_name(chosen)
    if target.is_file():
        _log.debug("server jar cache hit: %s", target)
        return target
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise JarDownloadError(f"cannot create the jar cache directory {cache}: {err}") from err
    deadline = clock.monotonic() + timeout
    with _exclusive(cache / f".{target.name}.lock", deadline, clock):
        if target.is_file():  # another process finished while we waited for the lock
            return target
        _remove_leftovers(cache, target.name)
        _fetch(_Download(target, chosen, env, maven_repo, progress, deadline, clock))
    _log.info("server jar %s ready at %s", chosen, target)
    return target


@attrs.frozen
class _Download:
    """One download of the jar ``version`` into ``target`` (its directory exists), bounded by ``deadline``."""

    target: Path
    version: str
    env: Mapping[str, str]
    maven_repo: PathLike | None
    progress: bool
    deadline: float
    clock: Clock

    def seconds_left(self) -> float:
        return max(1.0, self.deadline - self.clock.monotonic())


def _fetch(download: _Download) -> None:
    path_var = download.env.get("PATH", "")
    mvn = shutil.which("mvn", path=path_var) if path_var else None
    base_url = download.env.get(MAVEN_REPOSITORY_ENV, "").strip()
    if mvn:
        try:
            _fetch_with_mvn(mvn, download)
            return
        except JarDownloadError as err:
            if not base_url:
                raise
            _log.warning("mvn failed (%s); downloading from %s instead", err, MAVEN_REPOSITORY_ENV)
    if base_url:
        _fetch_with_https(base_url, download)
        return
    raise JarDownloadError(
        f"cannot download the Conductor server jar {download.version}: Maven (mvn) is not on PATH and "
        f"{MAVEN_REPOSITORY_ENV} is not set. Either install Maven, or set {MAVEN_REPOSITORY_ENV} "
        f"to the base URL of Maven Central or your mirror, or set {SERVER_JAR_ENV} to the path "
        "of a conductor-server boot jar."
    )


def _fetch_with_mvn(mvn: str, download: _Download) -> None:
    target, version = download.target, download.version
    local_repo = (Path(download.maven_repo) if download.maven_repo is not None
                  else _maven.default_local_repository(download.env))
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        copied = _maven.copy_with_mvn(
            mvn,
            version,
            work,
            local_repository=local_repo,
            log_path=target.parent / f"{target.name}.maven.log",
            progress=sys.stderr if download.progress else None,
            timeout=download.seconds_left(),
            clock=download.clock,
        )
        actual = sha1_of(copied)
        expected = _maven.published_sha1(local_repo, version)
        if expected is None:
            # Maven verified the download itself (-C); check at least that the copy is intact.
            _log.warning("Maven keeps no .sha1 for %s; comparing with its local copy", target.name)
            expected = sha1_of(local_repo / _maven.repository_path(version))
        _verify(copied, target.name, expected, actual)
        os.replace(copied, target)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _fetch_with_https(base_url: str, download: _Download) -> None:
    target = download.target
    if not base_url.startswith(("https://", "http://")):
        raise ConfigurationError(
            f"{MAVEN_REPOSITORY_ENV} must be an http(s) URL, got {base_url!r}", variable=MAVEN_REPOSITORY_ENV
        )
    url = f"{base_url.rstrip('/')}/{_maven.repository_path(download.version)}"
    expected = _http.fetch_sha1(url + ".sha1")
    fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent)
    os.close(fd)
    part = Path(name)
    try:
        stream = sys.stderr if download.progress else None
        actual = _http.download(url, part, label=f"{target.name} into {target.parent}", deadline=download.deadline,
                                progress=stream, clock=download.clock)
        _verify(part, target.name, expected, actual)
        os.replace(part, target)
    finally:
        part.unlink(missing_ok=True)


def _verify(path: Path, name: str, expected: str, actual: str) -> None:
    if expected != actual:
        raise JarDownloadError(f"checksum mismatch for {name}: expected SHA-1 {expected}, got {actual}")
    if not zipfile.is_zipfile(path):
        raise JarDownloadError(f"the download of {name} is not a jar (zip) file")


def sha1_of(path: Path) -> str:
    """Return the hex SHA-1 of a file.

    Raises:
        JarDownloadError: the file cannot be read.
    """
    digest = hashlib.sha1(usedforsecurity=False)  # the checksum Maven publishes beside the jar
    try:
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    except OSError as err:
        raise JarDownloadError(f"cannot read {path}: {err}") from err
    return digest.hexdigest()


def _remove_leftovers(cache: Path, name: str) -> None:
    """Delete temporary files of downloads that died (the caller holds the lock)."""
    for leftover in cache.glob(f".{name}.*"):
        if leftover.suffix not in (".part", ".tmp"):
            continue
        _log.debug("removing leftover %s", leftover)
        if leftover.is_dir():
            shutil.rmtree(leftover, ignore_errors=True)
        else:
            leftover.unlink(missing_ok=True)


@contextlib.contextmanager
def _exclusive(lock_path: Path, deadline: float, clock: Clock) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``lock_path`` until the block ends (bounded wait)."""
    with open(lock_path, "a") as fh:
        told = False
        while True:
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError as err:
                if clock.monotonic() >= deadline:
                    raise JarDownloadError(
                        f"timed out waiting for another process to finish downloading ({lock_path})"
                    ) from err
                if not told:
                    _log.info("another process is downloading the server jar; waiting")
                    told = True
                time.sleep(_LOCK_POLL_SECONDS)  # bounded by the deadline above
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
