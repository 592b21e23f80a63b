"""The CLI's record of the server it started, so later commands can find and stop it.

One JSON file, ``<state dir>/server.json`` (``CONDUCTOR_AGENTS_STATE_DIR`` overrides the
directory). The record keeps the process start time as well as the pid, so a pid
the system has since given to another process is never mistaken for the server.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from . import _dirs, _proc

_log = logging.getLogger("conductor_agents.local_server")

STATE_FILE_NAME = "server.json"


def state_file(environ: Mapping[str, str] | None = None) -> Path:
    """Return the path of the record file."""
    return _dirs.state_dir(environ) / STATE_FILE_NAME


@attrs.frozen
class MemberRecord:
    """One more process of a recorded server: its Redis, or a cluster's nodes and balancer."""

    role: str
    pid: int
    log_path: Path = attrs.field(converter=Path)
    start_ticks: int | None = None

    def is_alive(self) -> bool:
        """True when the process still runs (and is the same process)."""
        if not _proc.is_alive(self.pid):
            return False
        return self.start_ticks is None or _proc.start_ticks(self.pid) == self.start_ticks

    @classmethod
    def for_process(cls, role: str, pid: int, log_path: Path) -> MemberRecord:
        return cls(role=role, pid=pid, log_path=log_path, start_ticks=_proc.start_ticks(pid))

    def to_dict(self) -> dict[str, Any]:
        return {"role": self.role, "pid": self.pid, "log_path": str(self.log_path), "start_ticks": self.start_ticks}


def _members(value: Any) -> tuple[MemberRecord, ...]:
    return tuple(m if isinstance(m, MemberRecord) else MemberRecord(**m) for m in value or ())


@attrs.frozen
class ServerRecord:
    """Where a CLI-started server runs. Immutable, so thread-safe."""

    pid: int = attrs.field(validator=attrs.validators.instance_of(int))
    port: int = attrs.field(validator=attrs.validators.instance_of(int))
    data_dir: Path = attrs.field(converter=Path)
    log_path: Path = attrs.field(converter=Path)
    version: str | None = None
    started_at: float = 0.0
    start_ticks: int | None = None
    detached: bool = True
    backend: str = "sqlite"
    #: Every other process to stop with it, in stop order (a cluster: the balancer first, Redis last).
    members: tuple[MemberRecord, ...] = attrs.field(default=(), converter=_members)

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """The API base URL."""
        return f"{self.base_url}/api"

    def is_alive(self) -> bool:
        """True when the recorded process still runs (and is the same process)."""
        if not _proc.is_alive(self.pid):
            return False
        return self.start_ticks is None or _proc.start_ticks(self.pid) == self.start_ticks

    @classmethod
    def for_process(
        cls, *, pid: int, port: int, data_dir: Path, log_path: Path, version: str | None, detached: bool,
        backend: str = "sqlite", members: tuple[MemberRecord, ...] = (),
    ) -> ServerRecord:
        """Build the record of a process that runs now."""
        return cls(
            backend=backend,
            members=members,
            pid=pid,
            port=port,
            data_dir=data_dir,
            log_path=log_path,
            version=version,
            started_at=time.time(),
            start_ticks=_proc.start_ticks(pid),
            detached=detached,
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ServerRecord:
        """Build a record from its JSON form.

        Raises:
            KeyError, TypeError, ValueError: the data is not a record.
        """
        return cls(
            pid=data["pid"],
            port=data["port"],
            data_dir=data["data_dir"],
            log_path=data["log_path"],
            version=data.get("version"),
            started_at=float(data.get("started_at", 0.0)),
            start_ticks=data.get("start_ticks"),
            detached=bool(data.get("detached", True)),
            backend=str(data.get("backend", "sqlite")),
            members=tuple(MemberRecord(**m) for m in data.get("members") or ()),
        )

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form."""
        data = attrs.asdict(self)
        data["data_dir"] = str(self.data_dir)
        data["log_path"] = str(self.log_path)
        data["members"] = [m.to_dict() for m in self.members]
        return data


def load(path: Path) -> ServerRecord | None:
    """Return the record in ``path``; None when there is none or it is unreadable."""
    try:
        return ServerRecord.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as err:
        _log.warning("ignoring the unreadable server record %s: %s", path, err)
        return None


def save(path: Path, record: ServerRecord) -> None:
    """Write ``record`` to ``path`` atomically (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(record.to_dict(), fh, indent=2)
            fh.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def remove(path: Path) -> None:
    """Delete the record; no error when there is none."""
    path.unlink(missing_ok=True)
