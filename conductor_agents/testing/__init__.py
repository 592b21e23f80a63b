"""Testing helpers: run agents on a real Conductor server with a scripted, offline model.

See ``docs/testing.md``.
"""

from conductor_agents._common.public import publish as _publish
from conductor_agents.testing._errors import ScriptedLLMStateError, ScriptedLLMTimeoutError, ScriptError
from conductor_agents.testing._llm_request import LLMRequest, ToolOutput
from conductor_agents.testing._policies import is_stop_signal, listener_policy
from conductor_agents.testing._scripted_llm import ScriptedLLM
from conductor_agents.testing._scripts import Anomaly, Policy
from conductor_agents.testing._stack import LocalStack
from conductor_agents.testing._turns import Failure, Reply, ToolCall, Turn, Usage

__all__ = [
    # The fake model, and a real server wired to it
    "ScriptedLLM",
    "LocalStack",
    "LocalCluster",
    # Writing scripts
    "Failure",
    "Reply",
    "ToolCall",
    "Turn",
    "Usage",
    # Policies
    "Policy",
    "is_stop_signal",
    "listener_policy",
    # Inspecting what happened
    "Anomaly",
    "LLMRequest",
    "ToolOutput",
    # Errors
    "ScriptError",
    "ScriptedLLMStateError",
    "ScriptedLLMTimeoutError",
]

# Reprs, tracebacks and pickles say conductor_agents.testing.ScriptedLLM (LocalCluster: see local_server).
_publish(globals(), __name__)


def __getattr__(name: str) -> object:
    # LocalCluster lives in local_server (processes, ports); imported on first use only.
    if name == "LocalCluster":
        from conductor_agents.local_server import LocalCluster

        return LocalCluster
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
