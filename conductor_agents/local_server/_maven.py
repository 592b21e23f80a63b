"""Maven coordinates of the server jar and fetching it with the ``mvn`` client.

The jar is ``org.conductoross:conductor-server:<version>:jar:boot``. Maven downloads it
into its local repository (verifying checksums strictly, ``-C``) and copies it to an
output directory; the caller then checks the copy against the ``.sha1`` Maven keeps
next to the artifact. Maven's own output goes to a log file; the user sees one line.
"""

from __future__ import annotations

import logging
import subprocess
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from pathlib import Path
from typing import TextIO

from .._common.clock import SYSTEM_CLOCK, Clock
from ..errors import JarDownloadError

_log = logging.getLogger("conductor_agents.local_server")

GROUP_ID = "org.conductoross"
ARTIFACT_ID = "conductor-server"
CLASSIFIER = "boot"

_TAIL_LINES = 20


def jar_file_name(version: str) -> str:
    """Return the jar's file name, e.g. ``conductor-server-3.32.3-boot.jar``."""
    return f"{ARTIFACT_ID}-{version}-{CLASSIFIER}.jar"


def repository_path(version: str) -> str:
    """Return the jar's path in a Maven2-layout repository (relative, ``/``-separated)."""
    return "/".join([*GROUP_ID.split("."), ARTIFACT_ID, version, jar_file_name(version)])


def default_local_repository(environ: Mapping[str, str]) -> Path:
    """Return Maven's local repository: ``localRepository`` of ``~/.m2/settings.xml``, else ``~/.m2/repository``."""
    home = Path(environ.get("HOME") or str(Path.home()))
    settings = home / ".m2" / "settings.xml"
    try:
        root = ET.parse(settings).getroot()  # noqa: S314 - the user's own Maven settings, not untrusted input
    except (OSError, ET.ParseError):
        return home / ".m2" / "repository"
    for element in root.iter():
        text = (element.text or "").strip()
        if element.tag.rsplit("}", 1)[-1] == "localRepository" and text:
            return Path(text.replace("${user.home}", str(home))).expanduser()
    return home / ".m2" / "repository"


def published_sha1(local_repository: Path, version: str) -> str | None:
    """Return the digest in the ``.sha1`` file Maven stored beside the artifact, if any."""
    path = local_repository / (repository_path(version) + ".sha1")
    try:
        words = path.read_text(encoding="ascii", errors="replace").split()
    except OSError:
        return None
    return words[0].lower() if words else None


def copy_with_mvn(
    mvn: str,
    version: str,
    out_dir: Path,
    *,
    local_repository: Path,
    log_path: Path,
    progress: TextIO | None,
    timeout: float,
    clock: Clock = SYSTEM_CLOCK,
) -> Path:
    """Run ``mvn dependency:copy`` into the empty directory ``out_dir``; return the copied jar.

    Maven's own output (several hundred lines on a first run) goes to ``log_path``, never to
    the terminal. ``progress``, when given, receives ONE line: what is fetched and where it
    goes, completed with its size and duration (or ``failed``) when Maven is done. The log
    is deleted after a success and kept after a failure, whose error holds its last lines.

    Raises:
        JarDownloadError: mvn failed, timed out or produced no jar.
    """
    artifact = f"{GROUP_ID}:{ARTIFACT_ID}:{version}:jar:{CLASSIFIER}"
    # -B: batch mode, plain lines (no colours, no progress bars) in the log file;
    # -C: --strict-checksums, fail rather than warn on a checksum mismatch.
    cmd = [
        mvn,
        "-B",
        "-C",
        f"-Dmaven.repo.local={local_repository}",
        "dependency:copy",
        f"-Dartifact={artifact}",
        f"-DoutputDirectory={out_dir}",
    ]
    _log.info("fetching %s with Maven (log: %s)", artifact, log_path)
    line = _ProgressLine(progress)
    line.begin(f"Fetching the Conductor server jar {version} with Maven into {log_path.parent} (first run only) ...")
    started = clock.monotonic()
    try:
        # cwd is the empty output dir so a pom.xml in the caller's directory is never built.
        returncode = _run(cmd, cwd=out_dir, log_path=log_path, timeout=timeout)
        jar = out_dir / jar_file_name(version)
        if returncode != 0:
            raise JarDownloadError(
                f"mvn could not fetch {artifact} (exit code {returncode}){_tail_note(log_path)}",
                log_tail=_tail(log_path),
            )
        if not jar.is_file():
            raise JarDownloadError(f"mvn reported success but {jar} does not exist{_tail_note(log_path)}",
                                   log_tail=_tail(log_path))
    except JarDownloadError:
        line.end(" failed")
        raise
    line.end(f" done: {jar.stat().st_size / _MB:.1f} MB in {clock.monotonic() - started:.0f} s")
    log_path.unlink(missing_ok=True)
    return jar


_MB = 1024 * 1024


class _ProgressLine:
    """One line on ``stream``: begun before a long step, completed when it ends. Not thread-safe."""

    def __init__(self, stream: TextIO | None) -> None:
        self._stream = stream

    def begin(self, text: str) -> None:
        self._write(text)

    def end(self, text: str) -> None:
        self._write(text + "\n")

    def _write(self, text: str) -> None:
        if self._stream is None:
            return
        try:
            self._stream.write(text)
            self._stream.flush()
        except (OSError, ValueError):  # a closed or broken stream: progress is not worth failing for
            self._stream = None


def _tail(log_path: Path) -> str:
    try:
        lines = log_path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-_TAIL_LINES:])


def _tail_note(log_path: Path) -> str:
    tail = _tail(log_path)
    where = f" (Maven's whole log: {log_path})"
    return f"{where}; its last lines:\n{tail}" if tail else where


def _run(cmd: list[str], *, cwd: Path, log_path: Path, timeout: float) -> int:
    """Run ``cmd`` with its output in ``log_path``; return its exit code."""
    try:
        with open(log_path, "wb") as log_file:
            done = subprocess.run(
                cmd, cwd=cwd, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT, timeout=timeout,
                check=False,  # the exit code is returned to the caller
            )
    except subprocess.TimeoutExpired as err:
        raise JarDownloadError(
            f"mvn did not finish within {timeout:.0f} s{_tail_note(log_path)}", log_tail=_tail(log_path)
        ) from err
    except OSError as err:
        raise JarDownloadError(f"cannot run {cmd[0]}: {err}") from err
    return done.returncode
