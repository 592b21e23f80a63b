"""The scripts a ScriptedLLM answers from, the requests it saw and what went wrong.

:class:`ScriptBook` holds everything behind one condition variable, held only for short
bookkeeping: policies run outside it, so concurrent runs never wait on each other's policy.
It does no I/O; the HTTP side hands it parsed requests and gets outcomes back.
"""

from __future__ import annotations

import collections
import logging
import secrets
import threading
from collections.abc import Callable, Iterable
from typing import Any

import attrs

from conductor_agents._common.checks import Refusal, a_number, an_int
from conductor_agents._common.clock import SYSTEM_CLOCK, Clock
from conductor_agents.testing._errors import ScriptedLLMTimeoutError, ScriptError
from conductor_agents.testing._llm_request import LLMRequest
from conductor_agents.testing._turns import Failure, Outcome, Reply, to_outcome

#: A bad argument raises ScriptError.
_SCRIPT = Refusal(ScriptError)

__all__ = ["Anomaly", "Policy", "ScriptBook", "bare_model"]

_log = logging.getLogger("conductor_agents.testing")

Policy = Callable[[LLMRequest], Any]
"""A function from the request to a turn (str, ToolCall, list of ToolCall, Reply, Failure)."""

PROVIDER_PREFIX = "openai/"


@attrs.frozen
class Anomaly:
    """Something a test should know about: the fake answered, but not from a script.

    ``kind`` is one of ``"unknown_model"``, ``"exhausted"``, ``"policy_error"`` (the policy
    raised or returned something that is not a turn) and ``"bad_request"`` (the body was not
    JSON). ``request`` is the request concerned, when it could be parsed.
    """

    kind: str
    model: str
    message: str
    request: LLMRequest | None = attrs.field(default=None, eq=False, repr=False)


def bare_model(model: str) -> str:
    """``"openai/x"`` or ``"x"`` → ``"x"``.

    Raises:
        ScriptError: ``model`` is empty or holds whitespace.
    """
    if not isinstance(model, str):
        raise ScriptError(f"model must be a string, got {type(model).__name__}")
    bare = model[len(PROVIDER_PREFIX):] if model.startswith(PROVIDER_PREFIX) else model
    if not bare or any(c.isspace() for c in bare):
        raise ScriptError(f"bad model name {model!r}: it must be non-empty and hold no whitespace")
    return bare


@attrs.define
class _Script:
    """The mutable state of one model's script. Guarded by the ScriptBook's lock."""

    turns: collections.deque[Outcome]
    policy: Policy | None
    used: int = 0
    failures: collections.deque[Failure] = attrs.field(factory=collections.deque)
    exhausted: bool = False


class ScriptBook:
    """Scripts by model, recorded requests and anomalies. Thread-safe."""

    def __init__(self, clock: Clock = SYSTEM_CLOCK) -> None:
        self._clock = clock
        self._cond = threading.Condition()
        self._scripts: dict[str, _Script] = {}
        self._requests: list[LLMRequest] = []
        self._anomalies: list[Anomaly] = []

    # --- scripting ------------------------------------------------------------------

    def register(self, turns: Iterable[Any] | None, policy: Policy | None, model: str | None, replace: bool) -> str:
        """Add a script; returns the bare model name. See ``ScriptedLLM.script``."""
        if turns is None and policy is None:
            raise ScriptError("a script needs turns, a policy, or both")
        if policy is not None and not callable(policy):
            raise ScriptError(f"policy must be callable, got {type(policy).__name__}")
        if isinstance(turns, (str, bytes)) or (turns is not None and not isinstance(turns, Iterable)):
            raise ScriptError("turns must be a list of turns (wrap a single turn in a list)")
        bare = bare_model(model) if model is not None else f"scripted-{secrets.token_hex(4)}"
        outcomes: collections.deque[Outcome] = collections.deque()
        for number, turn in enumerate(turns or ()):
            try:
                outcomes.append(to_outcome(turn))
            except ScriptError as err:
                raise ScriptError(f"turn {number} of the script for {bare!r}: {err}", model=bare) from err
        with self._cond:
            if bare in self._scripts and not replace:
                raise ScriptError(f"model {bare!r} already has a script (pass replace=True to swap it)", model=bare)
            self._scripts[bare] = _Script(turns=outcomes, policy=policy)
        return bare

    def fail_next(self, model: str, failure: Failure, count: int) -> None:
        """Answer the next ``count`` requests for ``model`` with ``failure``."""
        an_int(at_least=1, refusal=_SCRIPT).check("count", count)
        bare = bare_model(model)
        with self._cond:
            script = self._scripts.get(bare)
            if script is None:
                raise ScriptError(f"no script for model {bare!r}; register one with script() first", model=bare)
            script.failures.extend([failure] * count)

    def remaining_turns(self, model: str) -> int:
        """How many scripted turns (and pending failures) are left for ``model``."""
        with self._cond:
            script = self._scripts.get(bare_model(model))
            return 0 if script is None else len(script.turns) + len(script.failures)

    # --- answering ------------------------------------------------------------------

    def record(self, request: LLMRequest) -> None:
        """Remember ``request`` and wake anyone waiting for it."""
        with self._cond:
            self._requests.append(request)
            self._cond.notify_all()

    def decide(self, request: LLMRequest) -> Outcome:
        """The outcome for ``request``: a pending failure, the next turn, or the policy's answer.

        Never raises: whatever goes wrong becomes a final text explaining it, plus an anomaly.
        """
        model = request.model
        policy: Policy | None = None
        used = 0
        scripted: list[str] = []
        with self._cond:
            script = self._scripts.get(model)
            if script is None:
                scripted = sorted(self._scripts)
            elif script.failures:
                return script.failures.popleft()
            elif script.turns:
                script.used += 1
                return script.turns.popleft()
            else:
                policy = script.policy
                if policy is None:
                    script.exhausted = True
                used = script.used
        if script is None:
            return self._unknown_model(model, scripted, request)
        if policy is None:
            text = f"scripted-llm: the script for model {model!r} is exhausted (all {used} turns used)"
            return self._anomaly("exhausted", model, text, request)
        return self._ask(policy, request)

    def _ask(self, policy: Policy, request: LLMRequest) -> Outcome:
        try:
            turn = policy(request)
        except Exception as err:  # noqa: BLE001 - reported to the test as an anomaly and as text
            text = f"scripted-llm: the policy for model {request.model!r} raised {type(err).__name__}: {err}"
            return self._anomaly("policy_error", request.model, text, request)
        try:
            return to_outcome(turn)
        except ScriptError as err:
            text = f"scripted-llm: the policy for model {request.model!r} returned a bad turn: {err}"
            return self._anomaly("policy_error", request.model, text, request)

    def _unknown_model(self, model: str, scripted: list[str], request: LLMRequest) -> Failure:
        """A model nobody scripted: refused as a provider refuses a model it does not have (HTTP 404,
        ``model_not_found``), naming the models this fake scripts; and an anomaly."""
        names = ", ".join(f"openai/{name}" for name in scripted[:10]) or "none yet"
        more = f" and {len(scripted) - 10} more" if len(scripted) > 10 else ""
        text = (f"scripted-llm: no script for model {model!r}; the models scripted here are {names}{more} "
                "(register one with ScriptedLLM.script())")
        self.add_anomaly(Anomaly(kind="unknown_model", model=model, message=text, request=request))
        return Failure(status=404, body={"error": {"message": text, "type": "invalid_request_error", "param": "model",
                                                   "code": "model_not_found"}})

    def _anomaly(self, kind: str, model: str, message: str, request: LLMRequest | None) -> Reply:
        self.add_anomaly(Anomaly(kind=kind, model=model, message=message, request=request))
        return Reply(text=message)

    def add_anomaly(self, anomaly: Anomaly) -> None:
        """Record ``anomaly`` and log it at WARNING."""
        _log.warning("%s", anomaly.message)
        with self._cond:
            self._anomalies.append(anomaly)
            self._cond.notify_all()

    # --- inspecting -----------------------------------------------------------------

    def requests(self, model: str | None = None) -> tuple[LLMRequest, ...]:
        """A snapshot of the recorded requests, all or for one model, oldest first."""
        bare = None if model is None else bare_model(model)
        with self._cond:
            return tuple(r for r in self._requests if bare is None or r.model == bare)

    def anomalies(self, model: str | None = None) -> tuple[Anomaly, ...]:
        """A snapshot of the anomalies, all or for one model, oldest first."""
        bare = None if model is None else bare_model(model)
        with self._cond:
            return tuple(a for a in self._anomalies if bare is None or a.model == bare)

    def exhausted(self, model: str) -> bool:
        """True once a request for ``model`` found its turns used up and no policy."""
        with self._cond:
            script = self._scripts.get(bare_model(model))
            return script is not None and script.exhausted

    def wait_for_requests(self, model: str, n: int, timeout: float) -> tuple[LLMRequest, ...]:
        """Block until ``model`` has at least ``n`` recorded requests, at most ``timeout`` seconds."""
        an_int(at_least=0, refusal=_SCRIPT).check("n", n)
        a_number(at_least=0, refusal=_SCRIPT).check("timeout", timeout)
        bare = bare_model(model)
        deadline = self._clock.monotonic() + timeout
        with self._cond:
            while True:
                seen = tuple(r for r in self._requests if r.model == bare)
                remaining = deadline - self._clock.monotonic()
                if len(seen) >= n:
                    return seen
                if remaining <= 0:
                    raise ScriptedLLMTimeoutError(
                        f"model {bare!r} received {len(seen)} of {n} requests within {timeout} s",
                        model=bare, expected=n, received=len(seen), timeout=timeout,
                    )
                self._cond.wait(remaining)
