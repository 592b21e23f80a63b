"""Counts and timings of the tools this process runs: :meth:`AgentRuntime.stats` and
:meth:`AgentHandle.stats` return these values. Reading them costs no HTTP request.

Latencies are summarised over a recent window (the last :data:`WINDOW` samples) with the
nearest-rank percentile: the p-th percentile of ``n`` sorted samples is sample number
``ceil(p / 100 * n)``, so it is always a value that was actually measured.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import attrs

__all__ = ["LatencySummary", "RunInfo", "RunStats", "RuntimeStats", "WINDOW", "percentile"]

#: How many recent samples a latency summary covers.
WINDOW = 1000


def percentile(samples: Sequence[float], p: float) -> float | None:
    """The nearest-rank ``p``-th percentile (0 < p <= 100) of ``samples``; None when empty.

    Raises:
        ValueError: ``p`` is outside (0, 100].
    """
    if not 0 < p <= 100:
        raise ValueError(f"p must be in (0, 100], got {p!r}")
    if not samples:
        return None
    ordered = sorted(samples)
    rank = math.ceil(p / 100.0 * len(ordered))
    return ordered[max(1, rank) - 1]


@attrs.frozen
class LatencySummary:
    """Seconds: median, 99th percentile and maximum of the last ``count`` samples."""

    count: int = 0
    p50: float | None = None
    p99: float | None = None
    max: float | None = None

    @classmethod
    def of(cls, samples: Sequence[float]) -> LatencySummary:
        """Summarise ``samples`` (seconds)."""
        if not samples:
            return cls()
        return cls(count=len(samples), p50=percentile(samples, 50), p99=percentile(samples, 99),
                   max=max(samples))


@attrs.frozen
class RunInfo:
    """A run whose tools this process serves, and the task domain it polls for it."""

    execution_id: str
    domain: str | None = None


@attrs.frozen
class RunStats:
    """This process's work for one run.

    ``tools_executed`` counts tool bodies that finished here (any outcome), of which
    ``tools_failed`` raised or returned something unusable; ``tools_in_flight`` are running
    now. ``pickup_latency`` is the server's ``startTime - scheduledTime`` of the tasks this
    process polled: how long a task waited for a worker.
    """

    execution_id: str
    domain: str | None = None
    tools_executed: int = 0
    tools_failed: int = 0
    tools_in_flight: int = 0
    tool_duration: LatencySummary = attrs.field(factory=LatencySummary)
    pickup_latency: LatencySummary = attrs.field(factory=LatencySummary)


@attrs.frozen
class RuntimeStats:
    """This process's work across every run of one :class:`~conductor_agents.AgentRuntime`.

    ``active_runs`` are the runs whose tools it serves now, with their domains;
    ``polls`` / ``poll_errors`` count task polls sent and failed since the runtime started.
    """

    tools_executed: int = 0
    tools_failed: int = 0
    tools_in_flight: int = 0
    tool_duration: LatencySummary = attrs.field(factory=LatencySummary)
    pickup_latency: LatencySummary = attrs.field(factory=LatencySummary)
    active_runs: tuple[RunInfo, ...] = ()
    polls: int = 0
    poll_errors: int = 0

    @property
    def domains(self) -> tuple[str, ...]:
        """The distinct task domains polled for active runs (the shared poller has none)."""
        return tuple(sorted({r.domain for r in self.active_runs if r.domain}))
