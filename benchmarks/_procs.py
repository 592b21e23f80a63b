"""Process measurements from /proc: CPU time, resident memory, threads, process trees (Linux)."""

from __future__ import annotations

import os
from typing import Dict, Iterable, List

_TICK = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> List[str]:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def tree(root: int) -> List[int]:
    """``root`` and its live descendants."""
    children: Dict[int, List[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                children.setdefault(int(_stat_fields(int(entry))[1]), []).append(int(entry))
            except (OSError, IndexError, ValueError):
                continue
    out, todo = [], [root]
    while todo and len(out) < 10_000:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


def cpu_seconds(pids: Iterable[int]) -> Dict[int, float]:
    """utime + stime of each pid (processes that vanished are left out)."""
    out = {}
    for pid in pids:
        try:
            fields = _stat_fields(pid)
            out[pid] = (int(fields[11]) + int(fields[12])) / _TICK
        except (OSError, IndexError, ValueError):
            continue
    return out


def cpu_delta(before: Dict[int, float], after: Dict[int, float]) -> float:
    """CPU seconds spent between two samples by the processes present in both."""
    return sum(after[pid] - before[pid] for pid in after if pid in before)


def memory(pids: Iterable[int]) -> Dict[str, float]:
    """Summed RSS and PSS (MB), threads and process count of ``pids``."""
    rss = pss = 0
    threads = procs = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        rss += int(line.split()[1])
                    elif line.startswith("Threads:"):
                        threads += int(line.split()[1])
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        pss += int(line.split()[1])
                        break
            procs += 1
        except OSError:
            continue
    return {"rss_mb": rss / 1024.0, "pss_mb": pss / 1024.0, "threads": threads, "processes": procs}
