""":class:`ConductorAgentsInstrumentor`: turns this SDK's OpenTelemetry traces and metrics on and off."""

from __future__ import annotations

import threading
from typing import Any

from . import hooks

__all__ = ["ConductorAgentsInstrumentor"]

_lock = threading.Lock()


class ConductorAgentsInstrumentor:
    """Emits OpenTelemetry spans and GenAI metrics for every runtime of this process, once instrumented.

    Shaped like OpenTelemetry's own instrumentors (``instrument()`` / ``uninstrument()``, idempotent),
    without depending on ``opentelemetry-instrumentation``: needs only ``opentelemetry-api``
    (``pip install conductor-agents[otel]``), plus an SDK or distro of your choice to export.

    Process-wide, like every OpenTelemetry instrumentor: it applies to every :class:`AgentRuntime` of the
    process, including ones built before the call. Thread-safe.
    """

    def instrument(self, *, tracer_provider: Any | None = None, meter_provider: Any | None = None,
                   **_ignored: Any) -> None:
        """Start emitting spans (to ``tracer_provider``) and metrics (to ``meter_provider``); the global
        providers by default. Calling it again replaces the providers.

        Raises:
            ImportError: ``opentelemetry-api`` is not installed (``pip install conductor-agents[otel]``).
        """
        try:
            from .telemetry import Telemetry
        except ImportError as err:  # the extra is absent: say how to get it
            raise ImportError("tracing needs opentelemetry-api: pip install 'conductor-agents[otel]'") from err
        with _lock:
            hooks.install(Telemetry(tracer_provider=tracer_provider, meter_provider=meter_provider))

    def uninstrument(self, **_ignored: Any) -> None:
        """Stop emitting. Spans of runs still open are ended now (their runs go on). Idempotent."""
        with _lock:
            hooks.install(None)

    @property
    def is_instrumented_by_opentelemetry(self) -> bool:
        """Whether spans are being emitted now (the name OpenTelemetry's instrumentors use)."""
        return hooks.active() is not None
