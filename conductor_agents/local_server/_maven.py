"""Maven coordinates of the server jar and fetching it with the ``mvn`` client.

The jar is ``org.conductoross:conductor-server:<version>:jar:boot``. Maven downloads it
into its local repository (verifying checksums strictly, ``-C``) and copies it to an
output directory; the caller then checks the copy against the ``.sha1`` Maven keeps
next to the artifact.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Mapping, Optional

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
        root = ET.parse(settings).getroot()
    except (OSError, ET.ParseError):
        return home / ".m2" / "repository"
    for element in root.iter():
        if element.tag.rsplit("}", 1)[-1] == "localRepository" and (element.text or "").strip():
            return Path(element.text.strip().replace("${user.home}", str(home))).expanduser()
    return home / ".m2" / "repository"


def published_sha1(local_repository: Path, version: str) -> Optional[str]:
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
    progress: bool,
    timeout: float,
) -> Path:
    """Run ``mvn dependency:copy`` into the empty directory ``out_dir``; return the copied jar.

    With ``progress`` Maven's own output (including transfer progress) goes to
    standard error; otherwise Maven runs quietly and its output is kept for errors.

    Raises:
        JarDownloadError: mvn failed, timed out or produced no jar.
    """
    artifact = f"{GROUP_ID}:{ARTIFACT_ID}:{version}:jar:{CLASSIFIER}"
    flags = ["-C"]  # --strict-checksums: fail, not warn, on a checksum mismatch
    if not progress:
        flags += ["-B", "-q"]
    elif not _isatty(sys.stderr):
        flags += ["-B"]  # batch mode still prints "Downloading/Downloaded" lines
    cmd = [
        mvn,
        *flags,
        f"-Dmaven.repo.local={local_repository}",
        "dependency:copy",
        f"-Dartifact={artifact}",
        f"-DoutputDirectory={out_dir}",
    ]
    _log.info("fetching %s with Maven", artifact)
    # cwd is the empty output dir so a pom.xml in the caller's directory is never built.
    returncode, output = _run(cmd, cwd=out_dir, progress=progress, timeout=timeout)
    if returncode != 0:
        tail = "\n".join(output.splitlines()[-_TAIL_LINES:])
        detail = f"; its last lines:\n{tail}" if tail else " (see its output above)"
        raise JarDownloadError(
            f"mvn could not fetch {artifact} (exit code {returncode}){detail}", log_tail=tail
        )
    jar = out_dir / jar_file_name(version)
    if not jar.is_file():
        raise JarDownloadError(f"mvn reported success but {jar} does not exist")
    return jar


def _run(cmd: list[str], *, cwd: Path, progress: bool, timeout: float) -> tuple[int, str]:
    """Run ``cmd``; return its exit code and its output when it was captured."""
    target = _stderr_fd() if progress else None
    try:
        if target is not None:
            done = subprocess.run(
                cmd, cwd=cwd, stdin=subprocess.DEVNULL, stdout=target, stderr=target, timeout=timeout
            )
            return done.returncode, ""
        done = subprocess.run(
            cmd,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as err:
        raise JarDownloadError(f"mvn did not finish within {timeout:.0f} s") from err
    except OSError as err:
        raise JarDownloadError(f"cannot run {cmd[0]}: {err}") from err
    output = done.stdout.decode("utf-8", errors="replace")
    if progress:
        # Standard error has no file descriptor (e.g. under pytest): replay the output.
        sys.stderr.write(output)
        sys.stderr.flush()
    return done.returncode, output


def _stderr_fd() -> Optional[int]:
    try:
        sys.stderr.flush()
        return sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return None


def _isatty(stream: object) -> bool:
    try:
        return bool(stream.isatty())  # type: ignore[attr-defined]
    except (AttributeError, OSError, ValueError):
        return False
