"""conductor-agents: durable, stateful AI agents on the Conductor orchestration server.

The public names are re-exported here; everything else lives in private modules.
"""

# First of all: a Ctrl-C while the command line imports the package is exit 130, not a traceback.
from ._common.early_interrupt import hold as _hold_early_interrupt

_hold_early_interrupt()

import logging as _logging
from typing import TYPE_CHECKING as _TYPE_CHECKING

from ._answers.guardrails import Guardrail, GuardrailResult
from ._common.public import lazy_attributes as _lazy_attributes
from ._common.public import publish as _publish
from ._listener.delivery import MessageDelivery
from ._listener.running import RunningRun
from ._people.pending import HumanAnswer, PendingRequest, PendingToolCall
from ._scheduling import Schedule, Schedules
from ._teams.gates import Gate
from ._teams.model_settings import ModelSettings
from ._teams.subagents import Handoff, HandoffContext, Strategy
from ._teams.termination import Termination
from ._tooldefs.context import CancelReason, ToolContext, current_tool_context
from ._tracing import ConductorAgentsInstrumentor
from ._version import __version__
from .agent import Agent
from .aio import AsyncAgentHandle, AsyncAgentRuntime
from .continuation import CarryOver, Continuation
from .errors import (
    AgentDefinitionError,
    AgentTypeError,
    AnswerConflictError,
    AuthenticationError,
    ConductorAgentsError,
    ConfigurationError,
    ExecutionNotFoundError,
    ExecutionNotRunningError,
    InvalidAnswerError,
    JarDownloadError,
    JavaNotFoundError,
    LocalServerError,
    MessageLostError,
    MessageQueueDisabledError,
    MessageQueueFullError,
    MissingSecretError,
    ModelUnavailableError,
    NothingPendingError,
    OutputValidationError,
    PayloadError,
    ResumeError,
    RunContextError,
    RunPausedError,
    RuntimeClosedError,
    ScheduleNotFoundError,
    ServerError,
    ServerUnavailableError,
    ToolCancelled,
    ToolDefinitionError,
    ToolDescriptionWarning,
    ToolRetry,
    WaitTimeoutError,
    WorkerStallError,
    WorkerStartupError,
)
from .handle import AgentHandle
from .result import AgentResult, AgentStatus, ListenerTotals, RunStatus, TokenUsage, ToolCallRecord
from .runtime import AgentRuntime
from .settings import AgentSettings
from .tools import (
    ApiTool,
    HttpTool,
    HumanTool,
    McpTool,
    ToolArgumentsError,
    ToolDef,
    ToolRegistry,
    WaitForMessageTool,
    tool,
)

__all__ = [
    # Defining agents
    "Agent",
    "Continuation",
    "CarryOver",
    "ModelSettings",
    "ToolDef",
    "ToolRegistry",
    "WaitForMessageTool",
    "HumanTool",
    "HttpTool",
    "McpTool",
    "ApiTool",
    "tool",
    # Agents made of agents, and checks of their answers
    "Strategy",
    "Handoff",
    "HandoffContext",
    "Gate",
    "Guardrail",
    "GuardrailResult",
    "Termination",
    # Writing tools
    "ToolContext",
    "current_tool_context",
    "CancelReason",
    "ToolRetry",
    "ToolCancelled",
    # Running them
    "AgentRuntime",
    "AsyncAgentRuntime",
    "AsyncAgentHandle",
    "AgentSettings",
    "AgentHandle",
    "AgentResult",
    "AgentStatus",
    "RunStatus",
    "TokenUsage",
    "ToolCallRecord",
    "ListenerTotals",
    "MessageDelivery",
    "RunningRun",
    "Schedule",
    "Schedules",
    # Watching them: OpenTelemetry traces and metrics (the otel extra)
    "ConductorAgentsInstrumentor",
    # People in the loop
    "PendingRequest",
    "PendingToolCall",
    "HumanAnswer",
    # A real server on this machine
    "LocalServer",
    # Errors
    "ConductorAgentsError",
    "AgentDefinitionError",
    "AgentTypeError",
    "AnswerConflictError",
    "AuthenticationError",
    "ConfigurationError",
    "ExecutionNotFoundError",
    "ExecutionNotRunningError",
    "InvalidAnswerError",
    "JarDownloadError",
    "JavaNotFoundError",
    "LocalServerError",
    "MessageLostError",
    "MessageQueueDisabledError",
    "MessageQueueFullError",
    "MissingSecretError",
    "ModelUnavailableError",
    "NothingPendingError",
    "OutputValidationError",
    "PayloadError",
    "ResumeError",
    "RunContextError",
    "RunPausedError",
    "RuntimeClosedError",
    "ScheduleNotFoundError",
    "ServerError",
    "ServerUnavailableError",
    "ToolArgumentsError",
    "ToolDefinitionError",
    "ToolDescriptionWarning",
    "WaitTimeoutError",
    "WorkerStallError",
    "WorkerStartupError",
    "__version__",
]


# LocalServer is imported on first use: most programs talk to a remote server and never need it.
__getattr__ = _lazy_attributes(__name__, LocalServer="conductor_agents.local_server")
if _TYPE_CHECKING:  # type checkers see the class itself
    from .local_server import LocalServer


# Reprs, tracebacks and pickles say conductor_agents.Agent, not the private module it is written in.
_publish(globals(), __name__)
_logging.getLogger(__name__).addHandler(_logging.NullHandler())
