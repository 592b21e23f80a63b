"""How big a run is on the server, estimated from reads that do not grow with it (pure; no I/O).

A listener's stored size (its task list as ``GET /workflow/{id}?includeTasks=true`` returns it)
is, measured on Conductor 3.32.3 (``benchmarks/results.md``, *Long-lived listeners*), very nearly

    bytes = per_task * tasks + copies * turns * digest

- ``tasks``: how many tasks the run has (each carries its own copy of its definition: the seed
  agent's average is about 7.5 KB, more with more tools or longer instructions);
- ``turns``: model turns so far; ``digest``: the size of the run's variables (its tool-results
  digest, which every turn copies, with the conversation, into several tasks: ``copies`` is 5 to 9,
  growing with the messages' size).

With ``copies`` 9 the formula is within 15 % of the real size for messages from 300 bytes to 32 KB
(above it for small ones). The per-task figure depends on the agent, so the first run of an agent in
a process is measured once (one full read after a few turns) and the figure kept for its later runs.
"""

from __future__ import annotations

import threading

import attrs

__all__ = ["RunSize", "SizeModel"]

#: The seed agent's average bytes per task, before a measurement says better.
DEFAULT_PER_TASK = 8_000
#: How many times each turn stores the digest's worth of content (measured: 5 with 300-byte messages,
#: 8 with 4 KB, 9 with 32 KB ones; the larger is used, so small messages switch a little early).
DIGEST_COPIES = 9.0
#: A measurement is taken once a run has this many turns (too few make a poor average).
CALIBRATE_AT_TURN = 3


@attrs.frozen
class RunSize:
    """What the cheap reads say: task count, model turns, variables' size in bytes."""

    tasks: int
    turns: int
    digest: int


class SizeModel:
    """Estimates runs' stored sizes; one per runtime, shared by its runs. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._per_task: dict[str, float] = {}  # agent key -> measured bytes per task
        # Agent keys whose measurement one run is taking now: the others of the agent wait for it (a process
        # serving many listeners of one agent read every one of them whole, the heaviest read there is).
        self._measuring: set[str] = set()

    def estimate(self, agent_key: str, size: RunSize) -> int:
        """The estimated stored size of a run of the agent ``agent_key``."""
        with self._lock:
            per_task = self._per_task.get(agent_key, DEFAULT_PER_TASK)
        return int(per_task * size.tasks + DIGEST_COPIES * size.turns * size.digest)

    def needs_measurement(self, agent_key: str, size: RunSize) -> bool:
        """Whether a full read of this run would teach the model something (once per agent). True for one
        caller at a time: it then calls :meth:`measured`, or :meth:`measurement_failed`."""
        with self._lock:
            if agent_key in self._per_task or agent_key in self._measuring or size.turns < CALIBRATE_AT_TURN:
                return False
            self._measuring.add(agent_key)
            return True

    def measurement_failed(self, agent_key: str) -> None:
        """The full read promised by :meth:`needs_measurement` failed: another run may take it."""
        with self._lock:
            self._measuring.discard(agent_key)

    def measured(self, agent_key: str, size: RunSize, actual_bytes: int) -> float | None:
        """Learn from a full read: the agent's bytes per task (returned), never below a sane floor."""
        if size.tasks <= 0:
            self.measurement_failed(agent_key)
            return None
        per_task = max(1_000.0, (actual_bytes - DIGEST_COPIES * size.turns * size.digest) / size.tasks)
        with self._lock:
            self._per_task[agent_key] = per_task
            self._measuring.discard(agent_key)
        return per_task

    def turns_until(self, agent_key: str, size: RunSize, limit: int) -> float:
        """About how many more turns fit below ``limit`` bytes.

        The size grows as ``alpha * turns + beta * turns**2``: the tasks add a steady amount per turn,
        and each turn copies a digest that itself grows by about the same each turn.
        """
        if size.turns <= 0:
            return float("inf")
        with self._lock:
            per_task = self._per_task.get(agent_key, DEFAULT_PER_TASK)
        turns = float(size.turns)
        alpha = per_task * size.tasks / turns
        beta = DIGEST_COPIES * size.digest / turns
        if beta <= 0:
            return max(0.0, (limit - alpha * turns) / max(alpha, 1.0))
        root: float = (alpha * alpha + 4 * beta * limit) ** 0.5
        reach = (-alpha + root) / (2 * beta)  # alpha t + beta t^2 = limit
        return max(0.0, reach - turns)
