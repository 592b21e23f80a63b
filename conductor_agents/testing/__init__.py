"""Testing helpers: run agents on a real Conductor server with a scripted, offline model.

See ``docs/testing.md``.
"""

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
