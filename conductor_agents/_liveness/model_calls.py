"""Can the server call the run's model? Its first model turn says so, long before the server's retries do.

The server (3.32.3) makes every model call itself, as an ``LLM_CHAT_COMPLETE`` task retried three times
with exponential backoff (about a minute in all), then fails the run. When the call cannot succeed at
all (no route to the provider, a key it refuses), that minute is spent for nothing and the reason shows
only at the end, cut off. The provider's failure is in the failed attempt's ``reasonForIncompletion``
(the task's root cause, as the server words it), e.g.::

    Task execution failed: OpenAI Responses API call failed: Failed to connect to /127.0.0.1:45791
        — caused by: Connection refused
    Task execution failed: Anthropic Messages API call failed: api.anthropic.com — caused by: api.anthropic.com
    Task execution failed: OpenAI Responses API call failed: Responses API failed with status 401: {...}

A failure before the run's first model turn ever completed is the set-up, not a blip: :class:`FirstModelTurn`
reads the run's tasks until that turn completes (then never again) and turns such a failure into a
:class:`~conductor_agents.errors.ModelUnavailableError`. Later failures are left to the server's retries.
Pure reads; thread-safe.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Mapping
from typing import Any

from .._common.task_names import MODEL_TASK_TYPE
from .._wire.api import ConductorApi
from ..errors import ConductorAgentsError, ModelUnavailableError

__all__ = ["FirstModelTurn", "MODEL_TASK_TYPE", "classify_model_failure", "ended_model_failure", "model_failure_error",
           "unavailable_model_cancel_reason", "says_model_unavailable"]

#: The task type of a model call (the server's).

#: The environment variable the server reads each provider's key from (the server's own table).
PROVIDER_KEY_VARIABLES = {
    "openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY", "mistral": "MISTRAL_API_KEY",
    "cohere": "COHERE_API_KEY", "grok": "XAI_API_KEY", "perplexity": "PERPLEXITY_API_KEY",
    "huggingface": "HUGGINGFACE_API_KEY", "azureopenai": "AZURE_OPENAI_API_KEY", "gemini": "GEMINI_API_KEY",
    "google_gemini": "GEMINI_API_KEY",
}

NO_ROUTE = "no_route"
REJECTED_KEY = "rejected_key"
UNKNOWN_MODEL = "unknown_model"

_CALL_FAILED = re.compile(r"API call failed: (?P<what>.*?)(?: \u2014 caused by: (?P<root>.*))?\Z", re.S)
_STATUS = re.compile(r"failed with status (?P<status>\d{3})")
_NO_ROUTE_WORDS = ("failed to connect", "connection refused", "no route to host", "network is unreachable",
                   "unknownhost", "nodename nor servname", "name or service not known")
#: An UnknownHostException's message is the host name alone.
_HOST = re.compile(r"\A[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)+\Z")
_DETAIL_LIMIT = 120
_FAILED = ("FAILED", "FAILED_WITH_TERMINAL_ERROR")
log = logging.getLogger("conductor_agents.liveness")


def classify_model_failure(reason: Any) -> tuple[str, str] | None:
    """``(cause, detail)`` when a model task's failure ``reason`` says the call cannot succeed, else None.

    ``cause`` is ``"no_route"`` (the provider's host cannot be reached: refused, unknown, unreachable),
    ``"rejected_key"`` (the provider answered 401 or 403) or ``"unknown_model"`` (it answered 404: it has no
    model of that name, or none this key may use); ``detail`` is a short text for a person
    (never the provider's answer body, which may echo part of a key). Anything else (a 429, a 5xx, a
    timeout) may pass: None.
    """
    match = _CALL_FAILED.search(str(reason or ""))
    if match is None:
        return None
    what = match.group("what").strip()
    root = (match.group("root") or "").strip()
    status = _STATUS.search(what)
    if status is not None:
        code = int(status.group("status"))
        if code in (401, 403):
            return REJECTED_KEY, f"the provider answered HTTP {code}"
        return (UNKNOWN_MODEL, "the provider answered HTTP 404") if code == 404 else None
    text = f"{what} {root}".lower()
    if any(word in text for word in _NO_ROUTE_WORDS):
        detail = what if not root or root in what else f"{what}: {root}"
        return NO_ROUTE, detail[:_DETAIL_LIMIT]
    if _HOST.match(what) and (not root or root == what):
        return NO_ROUTE, f"unknown host {what}"[:_DETAIL_LIMIT]
    return None


#: How the SDK's cancel of such a run begins: the run's reason, and so its "error" event, says it.
_CANCEL_PREFIX = "the server cannot call the model: "


def unavailable_model_cancel_reason(detail: str) -> str:
    """The reason the SDK gives the server when it cancels a run whose model it cannot call."""
    return f"{_CANCEL_PREFIX}{detail}"


def says_model_unavailable(message: Any) -> bool:
    """Whether a run's error ``message`` is a model the server cannot call: the failed call's own reason,
    or the SDK's cancel for it. :meth:`AgentHandle.wait` raises one error that says why and what to do."""
    text = str(message or "")
    return text.startswith(_CANCEL_PREFIX) or classify_model_failure(text) is not None


def model_failure_error(execution_id: str, model: str, cause: str, detail: str, *,
                        ended: str = "was cancelled") -> ModelUnavailableError:
    """The one-line error for a run whose model the server cannot call: the cause, then the fix (``ended``:
    what became of the run, ``"was cancelled"`` by the SDK or ``"failed"`` after the server's retries)."""
    provider = model.split("/", 1)[0] if "/" in model else ""
    variable = PROVIDER_KEY_VARIABLES.get(provider, f"{provider.upper()}_API_KEY" if provider else None)
    why = {NO_ROUTE: "no route from the server to its provider",
           UNKNOWN_MODEL: "its provider has no such model (or none the server's key may use)"}.get(
        cause, "its provider refused the server's key")
    key = variable or "the provider's key"
    message = (f"the server cannot call the model {model or '(unknown)'}: {why} ({detail}). Models are called "
               f"by the server: give it {key} in its own environment and a route to the provider (`conductor-agents "
               f"server start --env {key}=...`), or choose a model it can call with CONDUCTOR_AGENT_MODEL "
               f"(offline: `conductor-agents server start --scripted-model`); run {execution_id} {ended}")
    return ModelUnavailableError(message, execution_id=execution_id, model=model, cause=cause, detail=detail,
                                 variable=variable)


def ended_model_failure(api: ConductorApi, run_id: str, reason: Any, *, named: str | None = None,
                        timeout: float | None = None) -> ModelUnavailableError | None:
    """The error for an ended run whose model the server could not call, read from its tasks; else None.

    ``reason`` is the run's own (its ``reasonForIncompletion``): only a run that failed for its model (the
    failed call's reason) or that the SDK cancelled for it is read, one request, and its last model call
    must have failed so (a model that answered since was callable after all). The error names ``named``
    (the id the caller holds; default ``run_id``). A read that fails is logged: None.
    """
    if not says_model_unavailable(reason):
        return None
    try:
        workflow = api.get_workflow(run_id, include_tasks=True, timeout=timeout) or {}
    except ConductorAgentsError as err:
        log.warning("run %s ended for its model, whose calls could not be read: %s", named or run_id, err)
        return None
    calls = [task for task in workflow.get("tasks") or ()
             if isinstance(task, Mapping) and task.get("taskType") == MODEL_TASK_TYPE]
    failed = [task for task in calls if task.get("status") in _FAILED]
    if not calls or calls[-1].get("status") not in (*_FAILED, "CANCELED") or not failed:
        return None
    classified = classify_model_failure(failed[-1].get("reasonForIncompletion"))
    if classified is None:
        return None
    ended = "was cancelled" if str(reason).startswith(_CANCEL_PREFIX) else "failed"
    return model_failure_error(named or run_id, _model_of(failed[-1]), *classified, ended=ended)


class FirstModelTurn:
    """Watches one run until its first model turn completes; a hopeless failure before then is an error.

    Thread-safe (a lock guards its state). ``settled`` once the turn completed, the run is not one to watch
    (a listener's later run: its model has answered before), or after ``max_reads`` reads.
    """

    def __init__(self, api: ConductorApi, *, max_reads: int = 120) -> None:
        self._api = api
        self._lock = threading.Lock()
        self._settled = False
        #: Reads before it gives up watching (a run whose first turns are sub-runs' has no model task of
        #: its own for a while: ~a minute of polls, then it costs nothing more).
        self._reads_left = max_reads

    def settle(self) -> None:
        """Stop watching (the model answered, or this is not the run's first model turn)."""
        with self._lock:
            self._settled = True

    @property
    def settled(self) -> bool:
        with self._lock:
            return self._settled

    def problem(self, execution_id: str, *, timeout: float | None = None) -> ModelUnavailableError | None:
        """The error when the run's model cannot be called, None while it may be (one read, bounded by
        ``timeout`` seconds, until settled).

        Raises:
            ServerError: the read failed.
        """
        with self._lock:
            if self._settled:
                return None
            self._reads_left -= 1
            self._settled = self._reads_left <= 0
        workflow = self._api.get_workflow(execution_id, include_tasks=True, timeout=timeout) or {}
        found: ModelUnavailableError | None = None
        for task in workflow.get("tasks") or ():
            if not isinstance(task, Mapping) or task.get("taskType") != MODEL_TASK_TYPE:
                continue
            if task.get("status") == "COMPLETED":
                self.settle()
                return None
            if found is None and task.get("status") in ("FAILED", "FAILED_WITH_TERMINAL_ERROR"):
                classified = classify_model_failure(task.get("reasonForIncompletion"))
                if classified is not None:
                    found = model_failure_error(execution_id, _model_of(task), *classified)
        return found


def _model_of(task: Mapping[str, Any]) -> str:
    inputs = task.get("inputData")
    if not isinstance(inputs, Mapping):
        return ""
    provider, model = inputs.get("llmProvider"), inputs.get("model")
    if provider and model and not str(model).startswith(f"{provider}/"):
        return f"{provider}/{model}"
    return str(model or "")
