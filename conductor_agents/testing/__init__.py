"""Testing helpers: run agents on a real Conductor server with a scripted, offline model.

See ``docs/testing.md``.
"""

from typing import TYPE_CHECKING as _TYPE_CHECKING

from conductor_agents._common.public import lazy_attributes as _lazy_attributes
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


# LocalCluster lives in local_server (processes, ports); imported on first use only.
__getattr__ = _lazy_attributes(__name__, LocalCluster="conductor_agents.local_server")
if _TYPE_CHECKING:  # type checkers see the class itself
    from conductor_agents.local_server import LocalCluster
