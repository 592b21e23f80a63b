"""OpenTelemetry traces and GenAI metrics of runs and tools, off until someone instruments them.

Owns everything this SDK knows of OpenTelemetry: :class:`ConductorAgentsInstrumentor` (the opt-in), the
hooks the runtime calls (:mod:`.hooks`: no-ops until instrumented) and the spans and metrics themselves
(:mod:`.telemetry`, the only module that imports ``opentelemetry``, imported only by ``instrument()``).
Imports nothing else of the package (it sits on the ground floor, beside ``_common``), so every part may
call its hooks; without the ``otel`` extra nothing here imports ``opentelemetry``.
"""

from .instrumentor import ConductorAgentsInstrumentor

__all__ = ["ConductorAgentsInstrumentor"]
