"""Unit tests for the error hierarchy (conductor_agents.errors) and the pinned public exports."""

import builtins
import inspect
import logging

import pytest

import conductor_agents
import conductor_agents.testing
from conductor_agents import errors
from conductor_agents._wire.transport import HttpError
from conductor_agents.errors import ConductorAgentsError
from conductor_agents.testing import ScriptedLLMStateError, ScriptedLLMTimeoutError, ScriptError
from conductor_agents.tools import ToolArgumentsError

# --- the hierarchy ----------------------------------------------------------------------------

#: Every error class of errors.py and the builtins a caller would catch it as (from its docstring).
BUILTIN_OF = {
    "ConductorAgentsError": (Exception,),
    "ConfigurationError": (ValueError,),
    "AgentDefinitionError": (ValueError,),
    "AgentTypeError": (TypeError,),
    "ToolDefinitionError": (TypeError,),
    "ToolDescriptionWarning": (UserWarning,),
    "PayloadError": (TypeError,),
    "ToolRetry": (Exception,),
    "ToolCancelled": (Exception,),
    "ServerError": (Exception,),
    "ServerUnavailableError": (ConnectionError,),
    "AuthenticationError": (PermissionError,),
    "ExecutionNotFoundError": (LookupError,),
    "ExecutionNotRunningError": (Exception,),
    "MessageQueueFullError": (Exception,),
    "RunPausedError": (Exception,),
    "ScheduleNotFoundError": (LookupError,),
    "MessageQueueDisabledError": (Exception,),
    "MessageLostError": (LookupError,),
    "WaitTimeoutError": (TimeoutError,),
    "WorkerStallError": (Exception,),
    "WorkerStartupError": (Exception,),
    "ResumeError": (ValueError,),
    "RuntimeClosedError": (RuntimeError,),
    "LocalServerError": (RuntimeError,),
    "JavaNotFoundError": (RuntimeError,),
    "JarDownloadError": (RuntimeError,),
    "NothingPendingError": (LookupError,),
    "AnswerConflictError": (RuntimeError,),
    "InvalidAnswerError": (ValueError,),
    "OutputValidationError": (ValueError,),
    "RunContextError": (ValueError,),
    "MissingSecretError": (LookupError,),
    "ModelUnavailableError": (ValueError,),
}


def error_classes(module):
    # Not by __module__: the exported ones report their public home (conductor_agents), not errors.py.
    return {name: cls for name, cls in inspect.getmembers(module, inspect.isclass)
            if issubclass(cls, BaseException) and cls.__module__ != "builtins"}


def test_error_classes_are_pinned():
    """errors.py defines exactly the known error classes."""
    assert sorted(BUILTIN_OF) == sorted(error_classes(errors))


@pytest.mark.parametrize("name", sorted(BUILTIN_OF))
def test_every_error_has_the_base_and_its_builtin(name):
    """Each error subclasses ConductorAgentsError and the builtin its docstring promises."""
    cls = getattr(errors, name)
    assert issubclass(cls, ConductorAgentsError)
    for builtin in BUILTIN_OF[name]:
        assert issubclass(cls, builtin)


@pytest.mark.parametrize("cls,builtin", [
    (ToolArgumentsError, ValueError),
    (HttpError, errors.ServerError),
    (ScriptError, ValueError),
    (ScriptedLLMStateError, RuntimeError),
    (ScriptedLLMTimeoutError, TimeoutError),
])
def test_errors_defined_elsewhere_join_the_hierarchy(cls, builtin):
    """Errors defined outside errors.py also derive from ConductorAgentsError and their builtin."""
    assert issubclass(cls, ConductorAgentsError) and issubclass(cls, builtin)


def test_no_error_shadows_a_builtin_name():
    """No error reuses a builtin exception's name without subclassing it."""
    for name, cls in error_classes(errors).items():
        shadowed = getattr(builtins, name, None)
        assert shadowed is None or issubclass(cls, shadowed), name


def test_server_error_subclasses_are_server_errors():
    """Every error about a server answer is a ServerError (one except clause catches them)."""
    for cls in (errors.ServerUnavailableError, errors.AuthenticationError, errors.ExecutionNotFoundError,
                errors.ExecutionNotRunningError, errors.MessageQueueFullError, errors.MessageQueueDisabledError,
                errors.RunPausedError):
        assert issubclass(cls, errors.ServerError), cls.__name__


def test_local_server_errors_are_local_server_errors():
    """Java and jar problems are LocalServerErrors."""
    assert issubclass(errors.JavaNotFoundError, errors.LocalServerError)
    assert issubclass(errors.JarDownloadError, errors.LocalServerError)


# --- typed fields -----------------------------------------------------------------------------


@pytest.mark.parametrize("cls,status", [
    (errors.ExecutionNotFoundError, 404),
    (errors.ExecutionNotRunningError, 409),
    (errors.MessageQueueFullError, 429),
    (errors.RunPausedError, 409),
    (errors.MessageQueueDisabledError, 404),
])
def test_execution_errors_carry_id_and_status(cls, status):
    """Execution errors carry execution_id and default to their HTTP status."""
    err = cls("msg", execution_id="wf-1")
    assert ("wf-1", status, "msg") == (err.execution_id, err.status, str(err))


def test_wait_timeout_fields():
    """WaitTimeoutError carries execution_id and timeout."""
    err = errors.WaitTimeoutError("late", execution_id="wf-1", timeout=2.0)
    assert ("wf-1", 2.0) == (err.execution_id, err.timeout)


def test_worker_stall_fields():
    """WorkerStallError carries task reference, execution id, domain and waited seconds."""
    err = errors.WorkerStallError("stalled", execution_id="wf-1", task_reference_name="t_ref", domain="d1",
                                  waited_seconds=31.5)
    assert ("wf-1", "t_ref", "d1", 31.5) == (err.execution_id, err.task_reference_name, err.domain,
                                             err.waited_seconds)


def test_definition_and_configuration_fields():
    """Configuration and definition errors name what was wrong."""
    assert "X_VAR" == errors.ConfigurationError("m", variable="X_VAR").variable
    err = errors.AgentDefinitionError("m", field="max_turns", value=0)
    assert ("max_turns", 0) == (err.field, err.value)
    err = errors.AgentTypeError("m", field="name", value=3)
    assert ("name", 3) == (err.field, err.value)


def test_other_fields():
    """ServerError.status, ResumeError.execution_id and LocalServerError.log_tail are kept."""
    assert (None, 502) == (errors.ServerError("m").status, errors.ServerError("m", status=502).status)
    assert "wf-9" == errors.ResumeError("m", execution_id="wf-9").execution_id
    assert ("", "tail") == (errors.LocalServerError("m").log_tail,
                            errors.JavaNotFoundError("m", log_tail="tail").log_tail)


def test_http_error_fields():
    """HttpError carries status, server message, method and path, and knows whether it is transient."""
    err = HttpError("m", status=503, server_message="busy", method="GET", path="/x")
    assert (503, "busy", "GET", "/x", True) == (err.status, err.server_message, err.method, err.path, err.transient)


# --- exports ----------------------------------------------------------------------------------

PACKAGE_ALL = [
    "Agent", "Continuation", "CarryOver", "ModelSettings", "ToolDef", "ToolRegistry", "WaitForMessageTool", "HumanTool", "HttpTool",
    "McpTool", "ApiTool", "tool", "Strategy", "Handoff", "HandoffContext", "Gate", "Guardrail", "GuardrailResult", "Termination",
    "ToolContext", "current_tool_context", "CancelReason", "ToolRetry", "ToolCancelled",
    "AgentRuntime", "AsyncAgentRuntime", "AsyncAgentHandle", "AgentSettings", "AgentHandle", "AgentResult", "AgentStatus", "RunStatus", "TokenUsage",
    "ToolCallRecord", "ListenerTotals", "MessageDelivery", "RunningRun", "Schedule", "Schedules", "ConductorAgentsInstrumentor",
    "PendingRequest", "PendingToolCall", "HumanAnswer",
    "LocalServer",
    "ConductorAgentsError", "AgentDefinitionError", "AgentTypeError", "AnswerConflictError", "AuthenticationError",
    "ConfigurationError", "ExecutionNotFoundError", "ExecutionNotRunningError", "InvalidAnswerError", "JarDownloadError",
    "JavaNotFoundError", "LocalServerError", "MessageLostError", "MessageQueueDisabledError", "MessageQueueFullError",
    "MissingSecretError", "ModelUnavailableError", "NothingPendingError", "OutputValidationError",
    "PayloadError", "ResumeError", "RunContextError", "RunPausedError", "RuntimeClosedError", "ScheduleNotFoundError", "ServerError", "ServerUnavailableError",
    "ToolArgumentsError", "ToolDefinitionError", "ToolDescriptionWarning", "WaitTimeoutError", "WorkerStallError", "WorkerStartupError",
    "__version__",
]

TESTING_ALL = [
    "ScriptedLLM", "LocalStack", "LocalCluster",
    "Failure", "Reply", "ToolCall", "Turn", "Usage",
    "Policy", "is_stop_signal", "listener_policy",
    "Anomaly", "LLMRequest", "ToolOutput",
    "ScriptError", "ScriptedLLMStateError", "ScriptedLLMTimeoutError",
]


def test_package_all_is_pinned():
    """conductor_agents.__all__ is exactly the reviewed public surface, in its grouped order."""
    assert PACKAGE_ALL == conductor_agents.__all__


def test_testing_all_is_pinned():
    """conductor_agents.testing.__all__ is exactly the reviewed testing surface."""
    assert TESTING_ALL == conductor_agents.testing.__all__


@pytest.mark.parametrize("module", [conductor_agents, conductor_agents.testing], ids=["package", "testing"])
def test_every_exported_name_resolves(module):
    """Every name in __all__ is an attribute of the module, and none is listed twice."""
    assert len(set(module.__all__)) == len(module.__all__)
    missing = [name for name in module.__all__ if getattr(module, name, None) is None]
    assert [] == missing


def test_every_exported_error_is_the_errors_module_class():
    """The package re-exports the errors module's classes themselves, not copies."""
    for name in conductor_agents.__all__:
        if name in BUILTIN_OF:
            assert getattr(errors, name) is getattr(conductor_agents, name)


def test_local_server_is_imported_lazily_and_resolves():
    """LocalServer resolves through the package's lazy __getattr__ to the local_server class."""
    from conductor_agents.local_server import LocalServer

    assert LocalServer is conductor_agents.LocalServer


def test_unknown_attribute_is_attribute_error():
    """Asking the package for a name it does not have is an AttributeError naming it."""
    with pytest.raises(AttributeError) as info:
        conductor_agents.NoSuchThing  # noqa: B018
    assert "NoSuchThing" in str(info.value)


def test_star_import_gives_all():
    """from conductor_agents import * binds exactly the names of __all__."""
    namespace = {}
    exec("from conductor_agents import *", namespace)  # noqa: S102
    assert sorted(PACKAGE_ALL) == sorted(k for k in namespace if k != "__builtins__")


def test_version_is_a_string():
    """__version__ is a non-empty string."""
    assert isinstance(conductor_agents.__version__, str) and conductor_agents.__version__


def test_package_logger_has_a_null_handler():
    """The package logger carries a NullHandler, so library logs never print unless the app configures logging."""
    handlers = logging.getLogger("conductor_agents").handlers
    assert any(isinstance(h, logging.NullHandler) for h in handlers)
