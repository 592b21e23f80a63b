"""Where the local server keeps its files: the jar cache, the CLI state and the CLI data dir.

Each location follows the XDG base directory conventions and has its own override
variable. Functions take an ``environ`` mapping so tests never touch the real
home directory.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

from ..errors import LocalServerError

_APP = "conductor-agents"

CACHE_DIR_ENV = "CONDUCTOR_AGENTS_CACHE_DIR"
"""Overrides the jar cache directory (default ``$XDG_CACHE_HOME/conductor-agents``)."""

STATE_DIR_ENV = "CONDUCTOR_AGENTS_STATE_DIR"
"""Overrides where the CLI records its detached server (default ``$XDG_STATE_HOME/conductor-agents``)."""


def _environ(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if environ is None else environ


def _xdg(environ: Mapping[str, str], variable: str, fallback: str) -> Path:
    value = environ.get(variable, "")
    # The XDG spec says relative values are invalid and must be ignored.
    if value and os.path.isabs(value):
        return Path(value)
    home = environ.get("HOME") or str(Path.home())
    return Path(home) / fallback


def _app_dir(environ: Mapping[str, str] | None, override: str, variable: str, fallback: str) -> Path:
    """``$override`` when set, else the XDG directory ``$variable`` (default ``~/fallback``) + ``conductor-agents``."""
    env = _environ(environ)
    value = env.get(override, "")
    if value:
        return Path(value).expanduser()
    return _xdg(env, variable, fallback) / _APP


def cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Return the directory that caches downloaded server jars."""
    return _app_dir(environ, CACHE_DIR_ENV, "XDG_CACHE_HOME", ".cache")


def state_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Return the directory holding the CLI's record of its detached server."""
    return _app_dir(environ, STATE_DIR_ENV, "XDG_STATE_HOME", ".local/state")


def default_data_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Return the CLI's default server data directory (SQLite database and log)."""
    env = _environ(environ)
    return _xdg(env, "XDG_DATA_HOME", ".local/share") / _APP / "server"


def run_data_dir(given: Path | None, owned: Path | None, prefix: str) -> Path:
    """The data directory of a local server or cluster: ``given`` (created when missing), else the
    one it created before (``owned``), else a new temporary directory named ``prefix...``.

    Raises:
        LocalServerError: the directory cannot be created.
    """
    try:
        if given is not None:
            given.mkdir(parents=True, exist_ok=True)
            return given
        return owned if owned is not None else Path(tempfile.mkdtemp(prefix=prefix)).resolve()
    except OSError as err:
        raise LocalServerError(f"cannot create the data directory: {err}") from err
