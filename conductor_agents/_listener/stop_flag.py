"""The server's stop flag of one run, and the stop message among a batch of messages (pure reading, and one post).

``POST /agent/{id}/stop`` sets the run's ``_stop_requested``, which the agent's loop reads at the end of each
iteration: set while a wait for messages is under way, the loop ends as soon as that wait completes, with no model
turn after it. :mod:`.stopping` decides when a listener's flag is set; this module only sets it and says whether a
batch of messages holds the stop message (``{"_signal": "stop"}``). Used by the forward of a listener that waits on
a ``HUMAN`` task (:mod:`.handover`), the serving process's turn task and ``stop()``. Thread-safe.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .._wire.api import ConductorApi
from .._wire.transport import HttpError
from ..result import STOP_SIGNAL, RunStatus, stop_requested

__all__ = ["behind_stop", "holds_stop", "post_stop_flag", "stop_heads", "stop_in_digest"]

log = logging.getLogger("conductor_agents.handle")

#: Posts of the flag before giving up on it sticking (the stop message, read by the model, still ends the run).
_ATTEMPTS = 3
#: A posted flag is read back this much later.
_READ_BACK_AFTER = 0.1


def _payloads(messages: Iterable[Any]) -> list[Any]:
    return [m.get("payload") for m in messages if isinstance(m, Mapping)]


def holds_stop(messages: Iterable[Any]) -> bool:
    """Whether a batch of message envelopes (``{id, payload, ...}``, as a wait's output lists them) holds the stop."""
    return any(payload == STOP_SIGNAL for payload in _payloads(messages))


def stop_heads(messages: Iterable[Any]) -> bool:
    """Whether the stop message is the first of a batch: nothing accepted before it is in the batch."""
    payloads = _payloads(messages)
    return bool(payloads) and payloads[0] == STOP_SIGNAL


def behind_stop(wait: Mapping[str, Any], message_id: str) -> bool:
    """Whether the wait ``wait`` (a task as the server lists it) took ``message_id`` in behind the stop message: a
    listener told to stop does not act on what follows the stop."""
    output = wait.get("outputData")
    messages = output.get("messages") if isinstance(output, Mapping) else None
    for message in messages if isinstance(messages, list) else ():
        if not isinstance(message, Mapping):
            continue
        if str(message.get("id")) == message_id:
            return False
        if message.get("payload") == STOP_SIGNAL:
            return True
    return False


def stop_in_digest(variables: Mapping[str, Any]) -> bool:
    """Whether a wait's result in a run's tool-results digest (``_last_tool_results``: what its next model turn
    reads) holds the stop message."""
    for entry in variables.get("_last_tool_results") or ():
        output = entry.get("output") if isinstance(entry, Mapping) else None
        messages = output.get("messages") if isinstance(output, Mapping) else None
        if isinstance(messages, list) and holds_stop(messages):
            return True
    return False


def post_stop_flag(api: ConductorApi, execution_id: str, *, pause: Callable[[float], Any] = lambda s: None) -> bool:
    """Set run ``execution_id``'s stop flag and see that it stuck; False when the run has ended.

    Called when no model call of the run is in flight (a model call's end writes back the run it read at its
    start): the flag is read back and posted again when a write of the server's undid it (a few times).

    Raises:
        ExecutionNotFoundError: the server does not know the run.
        ServerUnavailableError, ServerError: a request failed.
    """
    for attempt in range(_ATTEMPTS):
        try:
            api.stop_agent(execution_id)
        except HttpError as err:
            if err.status != 409:
                raise
            return attempt > 0  # ended (a repost: the first one ended it)
        pause(_READ_BACK_AFTER)
        workflow = api.workflow_status(execution_id, include_variables=True)
        if RunStatus.parse(workflow.get("status")).is_terminal or stop_requested(workflow):
            return True
        log.info("run %s: its stop flag was undone by the server; posting it again", execution_id)
    log.warning("run %s: its stop flag did not stick after %d posts; the stop message ends it", execution_id,
                _ATTEMPTS)
    return True
