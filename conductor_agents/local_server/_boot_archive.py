"""The boot archive: the server jar unpacked once and a JVM class archive made for it, so starts are faster.

A Conductor server spends most of its start loading, verifying and linking some 25,000
classes out of the jars nested in its boot jar. The JVM can keep that work in a file and
map it on the next start: an AOT cache on Java 25+ (JEP 483/514, ``-XX:AOTCache``), a
dynamic CDS archive on Java 21-24 (``-XX:SharedArchiveFile``). Both need the classes on a
plain class path, so the boot jar is first unpacked with Spring Boot's own
``-Djarmode=tools extract`` (the layout Spring Boot recommends for production). The
archive is made by one training start of the server that exits once its context is up
(``-Dspring.context.exit=onRefresh``), with the default JVM options and SQLite.

Layout: ``<cache>/boot/<jar key>/app/`` (the unpacked jar, Java-independent) and
``<cache>/boot/<jar key>/<java key>.aot`` or ``.jsa``, the jar key naming the jar's
version, size and modification time, the Java key its version and executable. Each is
built under a lock file in a temporary name and renamed into place, so concurrent first
starts build it once and nobody sees half of one. Anything that goes wrong here only
costs speed: :func:`prepare_launch` then returns the plain jar, and the JVM itself ignores
(with a warning in the server log) an archive it cannot use; :func:`discard` removes one
that proved stale or broken so the next start makes it again.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import zipfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

import attrs

from .._common.clock import SYSTEM_CLOCK, Clock
from ..errors import ConfigurationError, JarDownloadError
from . import _dirs, _proc
from ._jar import _exclusive
from ._java import JavaRuntime

_log = logging.getLogger("conductor_agents.local_server")

BOOT_ARCHIVE_ENV = "CONDUCTOR_AGENTS_BOOT_ARCHIVE"
"""``0``/``false`` turns the boot archive off (default on)."""

AOT_CACHE_MIN_JAVA = 25
"""From this Java on the archive is an AOT cache (one training run with ``-XX:AOTCacheOutput``)."""

CDS_MIN_JAVA = 21
"""From this Java on (and below :data:`AOT_CACHE_MIN_JAVA`) it is a dynamic CDS archive."""

#: Log lines by which the JVM says it could not use the archive (it then starts without it).
ARCHIVE_REJECTED_MARKERS: tuple[str, ...] = ("[error][aot]", "[error  ][aot]", "[error][cds]", "[error  ][cds]")

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
_EXTRACT_TIMEOUT = 300.0

#: Makes a training command: (java, jar to run, extra JVM options, data dir, port) → argv.
TrainingCommand = Callable[[Path, Path, Sequence[str], Path, int], Sequence[str]]


def _strings(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


@attrs.frozen
class BootLaunch:
    """How to launch the server: the jar for ``-jar`` and JVM options to add. Immutable, so thread-safe.

    ``archive`` is the class archive in use (None: the plain boot jar, no archive).
    """

    jar: Path = attrs.field(converter=Path)
    jvm_options: tuple[str, ...] = attrs.field(default=(), converter=_strings)
    archive: Path | None = None

    @classmethod
    def plain(cls, jar: Path) -> BootLaunch:
        """The boot jar as it is."""
        return cls(jar)


def boot_archive_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``CONDUCTOR_AGENTS_BOOT_ARCHIVE`` leaves the boot archive on (the default).

    Raises:
        ConfigurationError: the variable is set to something other than a yes/no word.
    """
    env = os.environ if environ is None else environ
    value = env.get(BOOT_ARCHIVE_ENV, "").strip().lower()
    if not value or value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigurationError(f"{BOOT_ARCHIVE_ENV} must be 0/1, true/false, yes/no or on/off, got {value!r}",
                             variable=BOOT_ARCHIVE_ENV)


def is_archivable_jar(jar: Path) -> bool:
    """True for a Spring Boot jar that carries its ``jarmode`` tools (how it is unpacked)."""
    try:
        with zipfile.ZipFile(jar) as archive:
            manifest = archive.read("META-INF/MANIFEST.MF").decode("utf-8", errors="replace")
            names = archive.namelist()
    except (OSError, KeyError, zipfile.BadZipFile):
        return False
    return "Spring-Boot-Version:" in manifest and any(
        name.startswith("BOOT-INF/lib/spring-boot-jarmode-tools") for name in names)


_failed: set[tuple[str, str]] = set()  # (jar key, java key) whose training failed in this process
_failed_lock = threading.Lock()


def prepare_launch(
    jar: Path,
    java: JavaRuntime,
    training_command: TrainingCommand,
    *,
    cache_dir: Path | None = None,
    timeout: float = 600.0,
    progress: bool = True,
    clock: Clock = SYSTEM_CLOCK,
) -> BootLaunch:
    """Return how to launch ``jar`` on ``java``: with its boot archive, made first when missing.

    Making it (once per jar and Java version, about one server start plus a few seconds) happens
    under a lock; a process that finds another one making it waits for it, up to ``timeout``.
    Never raises for a failure to make it: the plain jar is returned and the reason logged.
    Safe to call from several threads and processes at once.
    """
    if java.major < CDS_MIN_JAVA or not is_archivable_jar(jar):
        return BootLaunch.plain(jar)
    root = (cache_dir or _dirs.cache_dir()) / "boot" / _jar_key(jar)
    java_key = _java_key(java)
    suffix = ".aot" if java.major >= AOT_CACHE_MIN_JAVA else ".jsa"
    archive = root / f"{java_key}{suffix}"
    app_jar = root / "app" / jar.name
    if archive.is_file() and app_jar.is_file():
        return _launch(app_jar, archive, java)
    with _failed_lock:
        if (root.name, java_key) in _failed:
            return BootLaunch.plain(jar)
    deadline = clock.monotonic() + timeout
    try:
        root.mkdir(parents=True, exist_ok=True)
        with _exclusive(root.parent / f".{root.name}.lock", deadline, clock):
            if not app_jar.is_file():
                _announce(progress, f"Unpacking the Conductor server jar for faster starts into {root} "
                                    "(once per jar) ...")
                _extract(jar, java, root, deadline, clock)
            if not archive.is_file():
                _announce(progress, f"Making a class archive for faster server starts ({archive.name}, once "
                                    "per jar and Java version; about one server start) ...")
                _train(java, app_jar, archive, training_command, deadline, clock)
    except (OSError, JarDownloadError, _TrainingError) as err:
        _log.warning("starting the server without a boot archive: %s", err)
        with _failed_lock:
            _failed.add((root.name, java_key))
        return BootLaunch.plain(jar)
    return _launch(app_jar, archive, java)


def discard(launch: BootLaunch) -> None:
    """Delete ``launch``'s class archive (stale or broken), so the next start makes it again."""
    if launch.archive is not None:
        _log.warning("the JVM could not use the boot archive %s; it is deleted and made again next time",
                     launch.archive)
        launch.archive.unlink(missing_ok=True)


def discard_unpacked(launch: BootLaunch) -> None:
    """Delete the unpacked jar and archive of ``launch`` (a start with them failed, without them not)."""
    if launch.archive is not None:
        _log.warning("the server failed to start from its boot archive and started without it; "
                     "deleting %s (made again next time)", launch.archive.parent)
        discard(launch)
        shutil.rmtree(launch.archive.parent / "app", ignore_errors=True)


def rejected_archive(log_text: str) -> bool:
    """True when the server log says the JVM did not use the archive it was given."""
    return any(marker in log_text for marker in ARCHIVE_REJECTED_MARKERS)


# --- internals ---------------------------------------------------------------------------


class _TrainingError(Exception):
    """The training run did not leave an archive (the message says why)."""


def _launch(app_jar: Path, archive: Path, java: JavaRuntime) -> BootLaunch:
    flag = "-XX:AOTCache" if java.major >= AOT_CACHE_MIN_JAVA else "-XX:SharedArchiveFile"
    return BootLaunch(app_jar, (f"{flag}={archive}",), archive)


def _jar_key(jar: Path) -> str:
    stat = jar.stat()
    digest = hashlib.sha1(f"{jar.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode(),
                          usedforsecurity=False).hexdigest()[:12]
    return f"{jar.stem}-{digest}"


def _java_key(java: JavaRuntime) -> str:
    digest = hashlib.sha1(os.path.realpath(java.path).encode(), usedforsecurity=False).hexdigest()[:8]
    return f"java-{java.version}-{digest}"


def _announce(progress: bool, line: str) -> None:
    _log.info("%s", line)
    if progress:
        print(line, file=sys.stderr, flush=True)


def _extract(jar: Path, java: JavaRuntime, root: Path, deadline: float, clock: Clock) -> None:
    """Unpack ``jar`` into ``root/app`` (the caller holds the lock)."""
    work = Path(tempfile.mkdtemp(prefix=".app.", suffix=".tmp", dir=root))
    try:
        cmd = [str(java.path), "-Djarmode=tools", "-jar", str(jar), "extract", "--destination", str(work / "app")]
        _run(cmd, root / "extract.log", root, min(_EXTRACT_TIMEOUT, deadline - clock.monotonic()))
        if not (work / "app" / jar.name).is_file():
            raise _TrainingError(f"unpacking {jar.name} left no {jar.name} (see {root / 'extract.log'})")
        shutil.rmtree(root / "app", ignore_errors=True)  # a leftover of an older, broken unpacking
        os.rename(work / "app", root / "app")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _train(java: JavaRuntime, app_jar: Path, archive: Path, training_command: TrainingCommand,
           deadline: float, clock: Clock) -> None:
    """Start the server once from ``app_jar`` so the JVM writes ``archive`` (the caller holds the lock)."""
    root = archive.parent
    work = Path(tempfile.mkdtemp(prefix=f".{archive.name}.", suffix=".tmp", dir=root))
    try:
        output = work / archive.name
        if java.major >= AOT_CACHE_MIN_JAVA:
            flags = [f"-XX:AOTCacheOutput={output}"]
        else:
            flags = [f"-XX:ArchiveClassesAtExit={output}"]
        cmd = training_command(java.path, app_jar, [*flags, "-Dspring.context.exit=onRefresh"], work,
                               _proc.free_port())
        log = root / f"{archive.name}.training.log"
        _run(list(cmd), log, work, deadline - clock.monotonic())
        if not output.is_file() or output.stat().st_size == 0:
            raise _TrainingError(f"the training start wrote no archive (see {log})")
        os.replace(output, archive)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run(cmd: Sequence[str], log_path: Path, cwd: Path, timeout: float) -> None:
    """Run ``cmd`` to its end with its output in ``log_path``; raise _TrainingError unless it exits 0."""
    if timeout <= 0:
        raise _TrainingError("no time left to make the boot archive")
    with open(log_path, "w", encoding="utf-8") as log:
        proc = _proc.spawn(cmd, env=os.environ, log_file=log, cwd=cwd, detached=False)
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise _TrainingError(
                f"{Path(cmd[0]).name} did not finish within {timeout:.0f} s (see {log_path})") from None
    if code != 0:
        raise _TrainingError(f"{' '.join(cmd[:3])} ... exited with code {code} (see {log_path})")
