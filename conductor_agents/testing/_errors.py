"""Errors raised by the testing helpers.

They live here rather than in :mod:`conductor_agents.errors` because they belong to the
testing product; each still derives from :class:`~conductor_agents.errors.ConductorAgentsError`
and from the builtin a test would naturally catch.
"""

from __future__ import annotations

from conductor_agents.errors import ConductorAgentsError


class ScriptError(ConductorAgentsError, ValueError):
    """A script, a turn or a policy result is not something ScriptedLLM can answer with.

    Raised in the test's own thread when a script is registered, so a typo fails the test
    at once instead of surfacing later inside the fake server. ``model`` names the script
    at fault when there is one.
    """

    def __init__(self, message: str, *, model: str | None = None) -> None:
        super().__init__(message)
        self.model = model


class ScriptedLLMStateError(ConductorAgentsError, RuntimeError):
    """The ScriptedLLM is in the wrong state for the call (started twice, not started...)."""


class ScriptedLLMTimeoutError(ConductorAgentsError, TimeoutError):
    """``wait_for_requests`` reached its deadline before enough requests arrived.

    ``model`` is the model waited on, ``expected`` the number of requests asked for,
    ``received`` the number that had arrived, ``timeout`` the deadline in seconds.
    """

    def __init__(
        self, message: str, *, model: str, expected: int, received: int, timeout: float
    ) -> None:
        super().__init__(message)
        self.model = model
        self.expected = expected
        self.received = received
        self.timeout = timeout
