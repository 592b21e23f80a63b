"""Where a Conductor server JVM spends its CPU: per thread group (from /proc) and sampled stacks (jstack).

    .venv/bin/python benchmarks/_jvm.py PID [SECONDS]      # both, for one window, printed

Thread groups: each JVM thread's name as Linux keeps it (``/proc/PID/task/TID/comm``, the first 15
characters of the Java name) with its digits dropped, e.g. ``http-nio--exec-`` (Tomcat's request
threads), ``system-task-wor`` (the system task workers that evaluate PULL_WORKFLOW_MESSAGES),
``sweeper-thread-``, ``C2 CompilerThre``, ``GC Thread#``. Stacks: ``jstack`` of the JDK that runs
the server every ``interval`` s; for each RUNNABLE thread of the server's own code, the first frame
of ``com.netflix.conductor``/``org.conductoross``/``io.orkes`` (and the frame under it that is not).
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
import sys
import threading
import time
from typing import Counter, Dict, Optional

_TICK = os.sysconf("SC_CLK_TCK")
_OURS = ("com.netflix.conductor", "org.conductoross", "io.orkes", "org.conductor")
_WAITING_IN = ("sun.nio.ch.", "java.net.", "sun.nio.fs.", "jdk.internal.misc.Unsafe.park", "java.lang.Thread.sleep",
               "java.lang.Object.wait", "java.lang.ref.Reference.waitForReferencePendingList",
               "java.lang.Thread.yield", "jdk.internal.ref.")


def thread_cpu(pid: int) -> Dict[str, float]:
    """CPU seconds (utime+stime) of each thread group of ``pid`` so far."""
    out: Dict[str, float] = collections.defaultdict(float)
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return {}
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                raw = f.read()
        except OSError:
            continue
        name = raw[raw.index("(") + 1: raw.rindex(")")]
        fields = raw.rsplit(")", 1)[1].split()
        out[re.sub(r"\d+", "", name)] += (int(fields[11]) + int(fields[12])) / _TICK
    return dict(out)


def delta(before: Dict[str, float], after: Dict[str, float]) -> Dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0) > 0}


def jstack_for(pid: int) -> Optional[str]:
    """The jstack beside the java binary that runs ``pid`` (None when there is none)."""
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None
    path = os.path.join(os.path.dirname(exe), "jstack")
    return path if os.path.exists(path) else None


def _frames(dump: str) -> Counter[str]:
    hits: Counter[str] = collections.Counter()
    for block in dump.split("\n\n"):
        if "java.lang.Thread.State: RUNNABLE" not in block:
            continue
        frames = [ln.strip()[3:] for ln in block.splitlines() if ln.strip().startswith("at ")]
        if not frames or frames[0].startswith(_WAITING_IN):
            continue  # waiting on the network, a lock, a timer or the GC, not spending CPU
        for i, frame in enumerate(frames):
            if frame.startswith(_OURS):
                below = frames[i - 1] if i else frame
                hits[f"{_short(frame)} <- {_short(below)}"] += 1
                break
        else:
            hits[f"(no server frame) {_short(frames[0])}"] += 1
    return hits


def _short(frame: str) -> str:
    name = frame.split("(", 1)[0]
    parts = name.split(".")
    return ".".join(parts[-2:])


class StackSampler:
    """Samples ``jstack`` of ``pid`` every ``interval`` s on a thread until :meth:`stop`; counts frames."""

    def __init__(self, pid: int, interval: float = 1.0) -> None:
        self.pid = pid
        self.interval = interval
        self.samples = 0
        self.hits: Counter[str] = collections.Counter()
        self._tool = jstack_for(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-jstack", daemon=True)

    def start(self) -> "StackSampler":
        if self._tool:
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                dump = subprocess.run([self._tool, str(self.pid)], capture_output=True, text=True,
                                      timeout=30).stdout
            except (subprocess.SubprocessError, OSError):
                continue
            self.samples += 1
            self.hits.update(_frames(dump))

    def stop(self) -> dict:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(60)
        return {"samples": self.samples, "top": self.hits.most_common(15)}


def main(argv: "list[str]") -> int:
    pid, seconds = int(argv[0]), float(argv[1]) if len(argv) > 1 else 20.0
    c0, t0 = thread_cpu(pid), time.monotonic()
    sampler = StackSampler(pid).start()
    time.sleep(seconds)
    stacks = sampler.stop()
    used = delta(c0, thread_cpu(pid))
    wall = time.monotonic() - t0
    print(f"{sum(used.values()) / wall * 100:.1f}% of a core over {wall:.0f} s; by thread group:")
    for name, cpu in sorted(used.items(), key=lambda kv: -kv[1])[:15]:
        print(f"  {cpu / wall * 100:6.1f}%  {name}")
    print(f"runnable server frames in {stacks['samples']} jstack samples:")
    for frame, count in stacks["top"]:
        print(f"  {count:4d}  {frame}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
