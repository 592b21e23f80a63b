"""Reading the end of a server log without loading the whole file."""

from __future__ import annotations

import os
from pathlib import Path

_BLOCK = 64 * 1024


def tail_lines(path: Path, n: int, start: int = 0) -> str:
    """Return the last ``n`` lines of ``path`` at or after byte ``start`` ("" when there is no file)."""
    if n <= 0:
        return ""
    try:
        with open(path, "rb") as fh:
            end = fh.seek(0, os.SEEK_END)
            pos = end
            data = b""
            while pos > start and data.count(b"\n") <= n:
                step = min(_BLOCK, pos - start)
                pos -= step
                fh.seek(pos)
                data = fh.read(step) + data
    except OSError:
        return ""
    lines = data.decode("utf-8", errors="replace").splitlines()
    return "\n".join(lines[-n:])


def read_from(path: Path, start: int, limit: int = 256 * 1024) -> str:
    """Return up to ``limit`` bytes of ``path`` from byte ``start`` on, as text ("" when there is no file)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(start)
            data = fh.read(limit)
    except OSError:
        return ""
    return data.decode("utf-8", errors="replace")
