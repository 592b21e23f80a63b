"""``server start --scripted-model``: the scripted model's process beside the server, so the CLI and the samples
run with no model key.

The model is :mod:`conductor_agents.testing._dev_model` in a process of its own (it must outlive this
command, as a detached server does); it says where it listens in a ready file, and the server is started
with the environment it names (``OPENAI_BASE_URL``, ``OPENAI_API_KEY``). This module only runs it: what it
answers is documented there and in docs/cli.md.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import attrs

from .._common.clock import SYSTEM_CLOCK
from ..errors import LocalServerError
from ..local_server import _proc

__all__ = ["ScriptedModel", "start_scripted_model"]

_MODULE = "conductor_agents.testing._dev_model"
_READY_TIMEOUT = 30.0
_READY_POLL = 0.1
_STOP_TIMEOUT = 5.0


@attrs.frozen
class ScriptedModel:
    """A running scripted-model process: its pid and log, the model name and the server's environment for it."""

    pid: int
    log_path: Path
    model: str
    server_env: dict[str, str]

    def stop(self) -> None:
        """SIGTERM, then SIGKILL; idempotent."""
        if _proc.is_alive(self.pid):
            _proc.terminate(self.pid, _STOP_TIMEOUT)


def start_scripted_model(data_dir: Path, *, detached: bool) -> ScriptedModel:
    """Start the scripted model (log ``data_dir/scripted-model.log``) and wait until it listens.

    Raises:
        LocalServerError: it could not start, or did not say where it listens within 30 s.
    """
    data_dir.mkdir(parents=True, exist_ok=True)
    ready = data_dir / "scripted-model.ready"
    ready.unlink(missing_ok=True)
    log_path = data_dir / "scripted-model.log"
    with open(log_path, "a", encoding="utf-8") as log:
        proc = _proc.spawn([sys.executable, "-m", _MODULE, "--ready-file", str(ready)], env=dict(os.environ),
                           log_file=log, cwd=data_dir, detached=detached)
    found: list[dict[str, Any]] = []

    def ready_now() -> bool:
        info = _read(ready)
        if info is not None:
            found.append(info)
        return info is not None

    def failed(*_: Any) -> LocalServerError:
        return LocalServerError(f"the scripted model did not start (log: {log_path})")

    try:
        _proc.wait_ready(proc, ready_now, timeout=_READY_TIMEOUT, poll=_READY_POLL, clock=SYSTEM_CLOCK,
                         exited=failed, late=failed)
    except BaseException:
        if proc.poll() is None:
            _proc.terminate(proc.pid, _STOP_TIMEOUT)
        raise
    info = found[0]
    return ScriptedModel(pid=proc.pid, log_path=log_path, model=str(info["model"]),
                         server_env={str(k): str(v) for k, v in dict(info["server_env"]).items()})


def _read(ready: Path) -> dict[str, Any] | None:
    try:
        info = json.loads(ready.read_text())
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) and "model" in info and "server_env" in info else None

