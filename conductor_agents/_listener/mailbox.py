"""A continued listener's mailbox: one id that every sender can push to for the listener's whole life.

A continued listener is a chain of runs (:mod:`.chain`); a sender that pushes with the server's own
REST call (``POST /workflow/{id}/messages``) reaches only the run it names. So the SDK starts, beside
link 0, a small workflow of its own, :data:`MAILBOX_WORKFLOW`, whose id is the one callers hold
(``AgentHandle.execution_id``). It runs rounds::

    DO_WHILE (keepLastN 2) [ PULL_WORKFLOW_MESSAGES (blocking: false, up to 100),
                             SWITCH ("count/holding": "0/null" or "0/0" -> rest (HUMAN, optional, 1 s timeout) ;
                                     otherwise -> forward (SIMPLE)) ]

A round pulls what is queued without waiting; a pull that took messages (or a forward that holds some) hands them
to the forward, and the next round pulls again at once (messages pushed while a forward runs are taken without a
rest). An empty pull, while the last forward holds nothing, *rests* (version 4): a ``HUMAN`` task, which the server
never evaluates (a run waiting in one even leaves the server's decider queue), so an idle mailbox costs the server
nothing. The rest is optional and times out after a second (``timeoutSeconds`` of its inline definition): the server
checks that timeout only when it decides the run, and the server decides a run after every push to it
(``POST /workflow/{id}/messages``). So a push ends a rest older than a second and the round's next pull takes it:
a raw sender needs nothing but the push. A push that lands within a second of the previous round (its rest too
young) waits for the next decide: the SDK's own sender asks for one (:func:`~.sending.wake`,
``PUT /workflow/decide/{id}``), and the serving process has the server decide each mailbox it serves now and then
(:mod:`.mailbox_checks`: twice after each forward, ``AgentSettings.mailbox_check_seconds`` later, then at gaps that
double while it stays idle, up to ``mailbox_check_max_seconds``).

Only decides end a rest, never a task update of the SDK's: an update writes the whole task back and could undo the
server's own end of it (``docs/idle-listeners.md``, *The constraint*); decides of one run follow one another.

Runs of version 3 (the rest a ``WAIT`` of ``checkEvery`` seconds, ended early by
``POST /tasks/{id}/COMPLETED/signal``), 2 (the switch on the pull's count alone, the forward given only its pull) and
1 (a blocking pull, then the forward) keep running as they were started, served by the same forward (it accepts
either shape of input).

Version 3 brought held messages: the forward of a listener that waits on a ``HUMAN`` task, finding it busy, completes
with the messages it did not hand over (``held``, ``holding``) instead of handing its task back with them, and the
next round's forward is given those first, then what its pull took (:mod:`.holding`): what arrives while the
listener is busy reaches it in one hand-over at its next wait, as the server's own wait takes everything queued at
once.

The ``forward`` task's domain is the listener's run id, so the process that serves the listener polls
it like the listener's other tasks (also after an adoption or ``resume()``); it pushes each message it
was given into the listener with :func:`~.sending.send_to_listener` (exactly once across switches).
``keepLastN`` keeps the mailbox at seven tasks at most and the last two rounds' outputs, whatever its
age (measured on 3.32.3: the run's size stays flat). The mailbox's ``correlationId`` names the chain
(:func:`~.chain.mailbox_key`), so the directory resolves its id to the listener; its id is also
written in the server's poll data (:func:`~.head.write_mailbox`) for a process that holds only a
link's id.

The mailbox ends when the listener ends (the serving process, or whoever first sees the listener
ended, terminates it): a push after that answers 409, an error the sender sees.

A process killed mid-forward: before each push the forward writes a *mark* (one poll-data row per
listener: the message's id, and the server's time of the write), so the next delivery of the task
skips the messages before the marked one and settles the marked one: it was pushed if a run of the
listener pulled a message with the same payload after the mark (looked for once the listener has
waited on an empty queue, so nothing it accepted is still queued); otherwise it is pushed.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from .._common.clock import Clock
from .._common.task_names import FORWARD_TASK, MAILBOX_REST_TASK, REST_SECONDS, is_message_wait
from .._tooldefs.context import ToolContext
from .._wire.api import ConductorApi
from ..errors import (
    ConductorAgentsError,
    ExecutionNotFoundError,
    ExecutionNotRunningError,
    RunPausedError,
    ServerError,
    ToolRetry,
)
from ..result import STOP_SIGNAL, RunStatus
from ..tools import ToolDef, tool
from .chain import mailbox_key
from .directory import Chain, ChainDirectory, Link
from .following import end_mailbox, is_running
from .handover import complete_wait, delivery_lock, waiting_wait
from .head import read_mailbox, write_mailbox
from .holding import MAX_HELD, carried
from .parking import nudge
from .pausing import run_status
from .records import create_once
from .sending import send_to_listener, wake

__all__ = ["MAILBOX_WORKFLOW", "Mailboxes", "make_forward_tool", "wake"]

log = logging.getLogger("conductor_agents.continuation")

#: The workflow every listener's mailbox runs.
MAILBOX_WORKFLOW = "conductor_agents_mailbox"
#: The agent whose records say which mailbox a listener started with an idempotency key keeps (:mod:`.records`).
KEYED_MAILBOX_RECORD = "conductor_agents_keyed_mailbox"
#: 4: the round below (a non-blocking pull, then a forward or a rest; the forward given what the previous one held);
#: runs of 3 (the rest a WAIT of ``checkEvery``), 2 (no held messages) and 1 (a blocking pull, then a forward) keep
#: their own definition and the same forward.
_VERSION = 4
#: Iterations whose tasks and outputs the loop keeps (the server removes older ones).
_KEEP_ITERATIONS = 2
#: Messages one PULL takes at most (the server's own cap).
_BATCH = 100
#: The forward task's lease; the executor extends it every half of it while the forward runs.
_RESPONSE_TIMEOUT_SECONDS = 60
#: Deliveries of one forward task: a crash or a ``ToolRetry`` hands it back; it must never fail.
_RETRIES = 100_000
#: How long a re-delivered forward waits for the listener to come to rest before it settles a marked
#: message (then it is handed back and tried again).
_SETTLE_SECONDS = 120.0
#: How often a forward tries again while the listener is paused (its deliveries last a month of pause).
_PAUSED_RETRY_SECONDS = 30.0
_MARK = re.compile(r"^sending:([0-9a-f-]{36})$")
#: How long a forward looks at a busy listener (whose wait is not in progress) before it hands its task back: short,
#: since it holds one of the tool pool's threads, which the listener's own turn may need.
_BUSY_LOOK_SECONDS = 1.0
_BUSY_LOOK_EVERY = 0.25
#: A holding forward answers a wait only at its first look, while what its round pulled is all there is.
_FRESH_SECONDS = 0.1


def definitions() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The forward task's definition and the mailbox workflow's (the round: see the module's docstring)."""
    owner = "conductor-agents@localhost"
    task_def = {"name": FORWARD_TASK, "retryCount": _RETRIES, "retryLogic": "FIXED", "retryDelaySeconds": 1,
                "timeoutSeconds": 0, "responseTimeoutSeconds": _RESPONSE_TIMEOUT_SECONDS,
                "timeoutPolicy": "RETRY", "ownerEmail": owner,
                "description": "conductor-agents: forwards a listener's mailbox messages into its current run"}
    # "forward" names the forward scheduled last (this round's is not yet): what it held, and which round's it is.
    forward = {"name": FORWARD_TASK, "taskReferenceName": "forward", "type": "SIMPLE",
               "inputParameters": {"messages": "${pull.output.messages}", "held": "${forward.output.held}",
                                   "held_by": "${forward.referenceTaskName}", "holds": True},
               "taskDefinition": task_def}  # inline: no node's cache of task definitions can miss it
    # The rest: a HUMAN task, which the server never evaluates (and a run waiting in one leaves its decider queue), made
    # optional with a one-second timeout, so that any decide of the mailbox once it has rested a second ends it and
    # the next round pulls: the decide the server runs after every push (POST /workflow/{id}/messages), or one asked
    # for (PUT /workflow/decide/{id}). Only decides end it (never a task update: see the module's docstring).
    rest = {"name": MAILBOX_REST_TASK, "taskReferenceName": "rest", "type": "HUMAN", "optional": True,
            "inputParameters": {}, "taskDefinition": {
                "name": MAILBOX_REST_TASK, "timeoutSeconds": REST_SECONDS, "responseTimeoutSeconds": REST_SECONDS,
                "retryCount": 0, "timeoutPolicy": "RETRY", "ownerEmail": owner,
                "description": "conductor-agents: a listener's mailbox at rest (ended by the next decide)"}}
    rest_after = {**rest, "taskReferenceName": "rest_after"}  # the same rest: a reference name is used once
    workflow = {
        "name": MAILBOX_WORKFLOW, "version": _VERSION, "schemaVersion": 2, "ownerEmail": owner,
        "timeoutSeconds": 0, "restartable": True,
        "description": "conductor-agents: the one id of a continued listener (push messages here: they are taken "
                       "at once)",
        "tasks": [{
            "name": "mailbox_loop", "taskReferenceName": "loop", "type": "DO_WHILE",
            "inputParameters": {"keepLastN": _KEEP_ITERATIONS},
            # A round that rested has no forward of its own: the newest one kept (never an end) or none.
            "loopCondition": "$.forward == null || $.forward['end'] != true",
            "loopOver": [
                {"name": "mailbox_pull", "taskReferenceName": "pull", "type": "PULL_WORKFLOW_MESSAGES",
                 "inputParameters": {"batchSize": _BATCH, "blocking": False}},
                # "value-param" (no script engine): an empty pull rests while the last forward holds nothing ("0/0";
                # "0/null": it held nothing, or none is kept; the server writes a null as "null"), else forwards.
                {"name": "mailbox_taken", "taskReferenceName": "taken", "type": "SWITCH",
                 "evaluatorType": "value-param", "expression": "taken",
                 "inputParameters": {"taken": "${pull.output.count}/${forward.output.holding}"},
                 "decisionCases": {"0/null": [rest], "0/0": [rest_after]}, "defaultCase": [forward]},
            ],
        }],
    }
    return [task_def], [workflow]


def _sleep(seconds: float) -> bool:
    time.sleep(seconds)
    return False  # never closing


class Mailboxes:
    """Opens and ends listeners' mailboxes for one process. Thread-safe."""

    def __init__(self, api: ConductorApi, *, pause: Callable[[float], bool] | None = None) -> None:
        self._api = api
        self._pause = pause or _sleep
        self._lock = threading.Lock()
        self._registered = False

    def _register(self) -> None:
        with self._lock:
            if self._registered:
                return
        task_defs, workflow_defs = definitions()
        self._api.register_definitions(task_defs, workflow_defs)
        with self._lock:
            self._registered = True

    def open(self, run_id: str, agent_name: str, *, human_wait: bool = False, keyed: bool = False) -> str:
        """The mailbox of the listener on ``run_id``: the one written down (an idempotent start of the same
        listener, which may have ended: then so has its mailbox), else a new one.

        ``keyed``: the listener was started with an idempotency key, so another start of the same key may be opening
        one at this moment. Which one the listener keeps is decided by a record the server creates once
        (:mod:`.records`, key ``mailbox:RUN_ID``); the other is ended. Without a key, ``run_id`` is new and nobody
        else opens a mailbox for it.

        Raises:
            ServerUnavailableError, ServerError: a request failed.
        """
        known = read_mailbox(self._api, run_id)
        if known is not None:
            return known
        self._register()
        mailbox_id = self._api.start_workflow({
            "name": MAILBOX_WORKFLOW, "version": _VERSION, "input": {},
            "correlationId": mailbox_key(run_id, agent_name, human_wait=human_wait),
            "taskToDomain": {FORWARD_TASK: run_id},
        })
        if keyed:
            mailbox_id = self._elect(run_id, mailbox_id)
        write_mailbox(self._api, run_id, mailbox_id)
        log.info("listener on %s: mailbox %s opened", run_id, mailbox_id)
        return mailbox_id

    def _elect(self, run_id: str, mine: str) -> str:
        record = create_once(self._api, KEYED_MAILBOX_RECORD, f"mailbox:{run_id}", {"mailbox": mine, "run": run_id},
                             prompt=f"the mailbox of the listener on {run_id}", pause=self._pause,
                             kind="mailbox record")
        chosen = str((record.context or {}).get("mailbox") or "")
        if not chosen:
            raise ServerError(f"the mailbox record of the listener on {run_id} ({record.execution_id}) could not be "
                              f"read back")
        if chosen != mine:
            log.info("listener on %s: another start of its key opened mailbox %s first; %s is ended", run_id, chosen,
                     mine)
            self._api.terminate_workflow(mine, "conductor-agents: another start opened this listener's mailbox")
        return chosen


# -- the forward task --------------------------------------------------------------------


def _mark_type(run_id: str) -> str:
    return f"conductor_agents_forward_{run_id}"


def _read_mark(api: ConductorApi, run_id: str) -> tuple[str | None, int]:
    """The message id the last forward marked before pushing it, and the server's time of the mark (ms)."""
    for row in api.poll_data(_mark_type(run_id)):
        match = _MARK.match(str((row or {}).get("workerId") or ""))
        if match is not None:
            return match.group(1), int(row.get("lastPollTime") or 0)
    return None, 0


def _write_mark(api: ConductorApi, run_id: str, message_id: str) -> None:
    api.mark_presence(_mark_type(run_id), worker_id=f"sending:{message_id}", domain="f")


def make_forward_tool(api: ConductorApi, directory: ChainDirectory, *, switch_wait: float, clock: Clock,
                      stopping: threading.Event, worker_id: str = "conductor-agents",
                      batch_size_of: Callable[[str], int] = lambda run_id: 1,
                      parked_here: Callable[[str], bool] = lambda join_id: False,
                      answered: Callable[[Mapping[str, Any]], Any] = lambda join: None,
                      forwarded: Callable[[str], Any] = lambda mailbox_id: None) -> ToolDef:
    """The worker of the mailbox's forward task (served on the listener's domain). ``batch_size_of(run_id)``: how
    many messages the wait of the listener on ``run_id`` takes at once (its ``WaitForMessageTool``'s batch size);
    ``forwarded(mailbox_id)`` is told of each forward that ends (:meth:`.mailbox_checks.MailboxChecks.soon`)."""

    @tool(name=FORWARD_TASK)
    def conductor_agents_forward(ctx: ToolContext, messages: Any | None = None, held: Any | None = None,
                                 held_by: Any | None = None, holds: Any | None = None) -> dict[str, Any]:
        """Pushes a listener's mailbox messages into its current run (conductor-agents)."""
        try:
            chain = directory.chain(ctx.execution_id)
            given = carried(api, ctx.execution_id, ctx.reference_name, messages, held, held_by)  # held ones first
            if chain.human_wait:
                assert chain.run_id is not None
                done = hand_over(api, directory, chain, given, batch_size=batch_size_of(chain.run_id),
                                 worker_id=worker_id, clock=clock, pause=stopping.wait, parked_here=parked_here,
                                 answered=answered, holds=holds is True)
            else:
                done = _forward(api, directory, ctx.execution_id, given, switch_wait=switch_wait, clock=clock,
                                pause=stopping.wait)
            forwarded(ctx.execution_id)  # a push that lands as the next round rests is taken soon after
            return done
        except ToolRetry:
            raise
        except RunPausedError:  # kept in the mailbox until the listener is unpaused
            log.debug("mailbox %s: the listener is paused; forwarding later", ctx.execution_id)
            raise ToolRetry("the listener is paused", after_seconds=_PAUSED_RETRY_SECONDS) from None
        except Exception as err:  # noqa: BLE001 - the mailbox must never fail: hand the task back
            log.warning("mailbox %s: forwarding failed (%s: %s); trying again", ctx.execution_id,
                        type(err).__name__, err)
            raise ToolRetry(f"forwarding failed: {type(err).__name__}", after_seconds=2.0) from None

    return conductor_agents_forward


def _forward(api: ConductorApi, directory: ChainDirectory, mailbox_id: str, messages: list[Any], *,
             switch_wait: float, clock: Clock, pause: Callable[[float], Any]) -> dict[str, Any]:
    chain = directory.chain(mailbox_id)
    if not chain.continuable:
        raise ConductorAgentsError(f"run {mailbox_id} is not a listener's mailbox")
    assert chain.run_id is not None
    envelopes = [m for m in messages if isinstance(m, Mapping) and m.get("id")]
    ids = [str(m["id"]) for m in envelopes]
    marked, marked_at = _read_mark(api, chain.run_id)
    start = 0
    if marked in ids:  # a later delivery of this task: the messages before the mark went through
        start = ids.index(marked)
        if _was_pushed(api, directory, chain, envelopes[start], marked_at, clock=clock, pause=pause):
            log.info("mailbox %s: message %s reached the listener before the crash; not pushed again",
                     mailbox_id, marked)
            start += 1
    forwarded = start
    for envelope in envelopes[start:]:
        _write_mark(api, chain.run_id, str(envelope["id"]))
        payload = envelope.get("payload")
        if not isinstance(payload, Mapping):
            payload = {}
        try:
            send_to_listener(api, directory, mailbox_id, payload, switch_wait=switch_wait, clock=clock,
                             pause=pause, on_accepted=directory.note_accepted)
        except (ExecutionNotRunningError, ExecutionNotFoundError) as err:
            lost = ids[forwarded:]
            log.warning("mailbox %s: the listener has ended; %d message(s) pushed to the mailbox as it ended "
                        "were not delivered (%s)", mailbox_id, len(lost), err)
            return {"end": True, "forwarded": forwarded, "undelivered": lost}
        forwarded += 1
    return {"forwarded": forwarded}


def hand_over(api: ConductorApi, directory: ChainDirectory, chain: Chain, messages: list[Any], *, batch_size: int,
              worker_id: str, clock: Clock, pause: Callable[[float], Any],
              parked_here: Callable[[str], bool] = lambda join_id: False,
              answered: Callable[[Mapping[str, Any]], Any] = lambda join: None, holds: bool = False) -> dict[str, Any]:
    """Hand a mailbox's messages to a listener that waits on a ``HUMAN`` task (:mod:`.handover`), in order, up to
    ``batch_size`` per wait. While the listener is busy it is looked at again for a second, then, with ``holds``
    (mailbox version 3), the task completes with the messages not handed over (``held``, at most
    :data:`~.holding.MAX_HELD`), which the next round's forward is given first (:mod:`.holding`); otherwise the task
    is handed back (``ToolRetry``) with them. Holding, a wait is answered only at the first look: one found later
    completes the task holding everything, so the next round hands over what was pushed meanwhile too. Before each
    completion the first message's id is marked, so a later delivery of the task skips the messages a completed wait
    already holds (exactly once across a crash).
    """
    assert chain.run_id is not None
    envelopes = [m for m in messages if isinstance(m, Mapping) and m.get("id")]
    ids = [str(m["id"]) for m in envelopes]
    start = 0
    marked, _ = _read_mark(api, chain.run_id)
    if marked in ids:  # a later delivery of this task: what a completed wait holds went through
        found = _handed(api, directory, chain, marked)
        held = None if found is None else found[0]
        start = ids.index(marked) if held is None else max(ids.index(i) for i in held if i in ids) + 1
        if found is not None:  # the delivery that completed it may have died before it nudged the wait's join
            _wake_join(api, found[1], found[2], worker_id=worker_id, answered=answered)
    handed = start
    fresh_until = clock.monotonic() + _FRESH_SECONDS
    busy_until = clock.monotonic() + _BUSY_LOOK_SECONDS
    while handed < len(envelopes):
        batch = envelopes[handed:handed + max(1, batch_size)]
        # Holding, a wait found after the first look is not answered: what was pushed since this round's pull is
        # queued, and the next round's forward, given what this one holds, hands it all over at once.
        stale = holds and clock.monotonic() >= fresh_until and len(envelopes) - handed <= MAX_HELD
        with delivery_lock(chain.run_id):
            newest = directory.refresh(chain)
            wait, join = waiting_wait(api, newest.execution_id)
            if wait is not None and not stale:
                _write_mark(api, chain.run_id, str(batch[0]["id"]))
                complete_wait(api, newest.execution_id, wait, batch, worker_id=worker_id)
        if wait is not None and stale:
            return _holding(envelopes[handed:], handed)
        if wait is not None:
            if join is not None:
                nudge(api, join, worker_id=worker_id, parked_here=parked_here)
                # Looked at again whatever the nudge read: a nudge can meet an evaluation of the server's, and a
                # park sent by another process (killed since) can hold the join's queue message while the task
                # reads the evaluation's own callback, so this process sees no park to undo.
                answered(join)
            handed += len(batch)
            busy_until = clock.monotonic() + _BUSY_LOOK_SECONDS
            continue
        status = run_status(api, newest.execution_id)
        if status is RunStatus.PAUSED:
            raise RunPausedError(f"run {newest.execution_id} is paused", execution_id=newest.execution_id)
        if status.is_terminal and directory.refresh(chain).number <= newest.number:
            lost = ids[handed:]
            told = [e for e in envelopes[handed:] if e.get("payload") != STOP_SIGNAL]  # not the stop's own wake-up
            if told:
                log.warning("mailbox %s: the listener has ended; %d message(s) pushed to the mailbox as it ended "
                            "were not delivered", chain.execution_id, len(told))
            end_mailbox(api, directory, chain)  # ended by the SDK: nobody takes it for an end from outside
            return {"end": True, "forwarded": handed, "undelivered": lost}
        if clock.monotonic() >= busy_until:
            if holds and len(envelopes) - handed <= MAX_HELD:
                return _holding(envelopes[handed:], handed)
            raise ToolRetry("the listener is busy", after_seconds=0.5)
        if pause(_BUSY_LOOK_EVERY):
            raise ToolRetry("the process is closing", after_seconds=1.0)
    return {"forwarded": handed}


def _holding(left: list[Mapping[str, Any]], handed: int) -> dict[str, Any]:
    return {"forwarded": handed, "held": [dict(e) for e in left], "holding": len(left)}


def _wake_join(api: ConductorApi, execution_id: str, wait: Mapping[str, Any], *, worker_id: str,
               answered: Callable[[Mapping[str, Any]], Any]) -> None:
    """Make the join around a completed ``wait`` of run ``execution_id`` due now, and look at it again later, while
    it has not ended: a process killed between completing the wait and nudging the join it parked leaves that join
    parked for :data:`~.parking.PARK_SECONDS`, the listener answered but still. An update of a join that ended
    meanwhile is ignored by the server; one being evaluated is evaluated once more."""
    ref = str(wait.get("referenceTaskName") or "")
    tasks = api.workflow_tasks(execution_id, statuses=("IN_PROGRESS",), start=1, count=50).tasks  # 1: not the loop
    for join in tasks:
        if join.get("taskType") != "JOIN":
            continue
        iteration = join.get("iteration")
        suffix = f"__{iteration}" if join.get("loopOverTask") and isinstance(iteration, int) and iteration > 0 else ""
        if ref in {f"{r}{suffix}" for r in (join.get("inputData") or {}).get("joinOn") or () if isinstance(r, str)}:
            nudge(api, join, worker_id=worker_id, parked_here=lambda join_id: True)
            answered(join)


def _handed(api: ConductorApi, directory: ChainDirectory, chain: Chain,
            message_id: str) -> tuple[list[str], str, Mapping[str, Any]] | None:
    """The ids a completed wait of the listener's newest links was handed with ``message_id``, the run and the wait;
    or None."""
    newest = directory.refresh(chain)
    for number in range(newest.number, max(0, newest.number - 3) - 1, -1):
        try:
            total = api.workflow_tasks(chain.link(number).execution_id, statuses=("COMPLETED",), start=0,
                                       count=1).total
            page = api.workflow_tasks(chain.link(number).execution_id, statuses=("COMPLETED",),
                                      start=max(0, total - 50), count=50).tasks
        except ExecutionNotFoundError:
            continue
        for task in reversed(page):
            if not is_message_wait(task):
                continue
            held = [str(m.get("id")) for m in (task.get("outputData") or {}).get("messages") or ()
                    if isinstance(m, Mapping)]
            if message_id in held:
                return held, chain.link(number).execution_id, task
    return None


def _was_pushed(api: ConductorApi, directory: ChainDirectory, chain: Chain, envelope: Mapping[str, Any],
                since_ms: int, *, clock: Clock, pause: Callable[[float], Any]) -> bool:
    """Whether a marked message reached the listener (a run of it pulled the same payload after the mark).

    Looked at once the listener's current run has waited on an empty queue (two more evaluations of its
    wait than first seen) with no switch under way: whatever it accepted is pulled by then.

    Raises:
        ToolRetry: the listener did not come to rest within :data:`_SETTLE_SECONDS`.
    """
    payload = _canonical(envelope.get("payload"))
    deadline = clock.monotonic() + _SETTLE_SECONDS
    first: dict[str, int] = {}
    while True:
        newest = directory.refresh(chain)
        if _at_rest(api, chain, newest, first):
            break
        if clock.monotonic() >= deadline:
            raise ToolRetry("the listener did not come to rest to settle a forwarded message", after_seconds=5.0)
        if pause(0.5):  # this process is closing: the next delivery settles it
            raise ToolRetry("the process is closing", after_seconds=1.0)
    lowest = max(0, newest.number - 3)
    for number in range(newest.number, lowest - 1, -1):
        if _pulled_since(api, chain.link(number), payload, since_ms):
            return True
    return False


def _at_rest(api: ConductorApi, chain: Chain, newest: Link, first: dict[str, int]) -> bool:
    if newest.number > 0 and is_running(api, chain.link(newest.number - 1).execution_id):
        return False  # a switch is under way
    status = run_status(api, newest.execution_id)
    if status is RunStatus.PAUSED:  # it pulls nothing until unpaused: settle the message then
        raise RunPausedError(f"run {newest.execution_id} is paused", execution_id=newest.execution_id)
    if status.is_terminal:
        return True  # ended: nothing more arrives
    page = api.workflow_tasks(newest.execution_id, statuses=("IN_PROGRESS",), start=1, count=20)
    for task in page.tasks:
        if task.get("taskType") == "PULL_WORKFLOW_MESSAGES":
            count = int(task.get("pollCount") or 0)
            seen = first.setdefault(str(task.get("taskId")), count)
            if count >= seen + 2:
                return True
    return False


def _pulled_since(api: ConductorApi, link: Link, payload: str, since_ms: int) -> bool:
    """Whether a wait-for-message task of ``link`` that ended after ``since_ms`` pulled ``payload``."""
    try:
        total = api.workflow_tasks(link.execution_id, statuses=("COMPLETED",), start=0, count=1).total
    except ExecutionNotFoundError:
        return False
    start = total
    while start > 0:
        start = max(0, start - 50)
        page = api.workflow_tasks(link.execution_id, statuses=("COMPLETED",), start=start, count=50).tasks
        older = False
        for task in page:
            if task.get("taskType") != "PULL_WORKFLOW_MESSAGES":
                continue
            if int(task.get("endTime") or 0) < since_ms:
                older = True
                continue
            for message in (task.get("outputData") or {}).get("messages") or ():
                if isinstance(message, Mapping) and _canonical(message.get("payload")) == payload \
                        and _received_ms(message.get("receivedAt")) >= since_ms:
                    return True
        if older:
            return False
    return False


def _canonical(payload: Any) -> str:
    return json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)


def _received_ms(value: Any) -> int:
    """An ISO-8601 ``receivedAt`` (the server's clock) in ms since the epoch; 0 when unreadable."""
    try:
        text = str(value)
        match = re.match(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?Z$", text)
        if match is None:
            return 0
        whole = datetime.strptime(match.group(1) + "+0000", "%Y-%m-%dT%H:%M:%S%z").timestamp()
        fraction = float("0." + match.group(2)) if match.group(2) else 0.0
        return int((whole + fraction) * 1000)
    except (TypeError, ValueError):
        return 0
