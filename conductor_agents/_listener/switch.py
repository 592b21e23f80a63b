"""Continuing link *n* of a listener as link *n+1*: the protocol, step by step (see ``docs/concepts.md``).

The server offers no way to shrink a running run and deletes a run's message queue when the run
ends, so a switch must never end link *n* while a message that a sender was told is accepted may
still be in its queue. The steps, each safe to repeat and to take over from a process that died in
the middle of them (every fact lives on the server):

1. **Start link n+1** (``POST /agent/start``, same agent, same ``runId`` so the same task domain and
   the same serving process, idempotency key ``conductor-agents/<run id>/<n+1>/<agent>``): create-once,
   so a repeat gets the same run. It begins with a *carry* task (a prefill tool call the server routes
   to the domain) that nobody polls: the new run takes no model turn until the switch is committed.
   From now on link n+1 exists, which is what the SDK's senders look at (:mod:`conductor_agents._listener.sending`),
   and it accepts messages.
2. **Drain link n.** Link n goes on as usual: a message accepted before step 1 (or pushed by a sender
   that had not looked yet) is pulled and acted on there. The drain ends once link n waits for a
   message, no tool of it runs or waits, and its waiting wait-for-message task has been evaluated
   (each evaluation pops the queue) at least once after step 1 and found nothing: proven when the
   task was scheduled after link n+1 (by the server's clock, with a margin), or else by two
   evaluations more than when it was first seen (the second one started after step 1). So every
   message accepted before step 1 has been pulled. Bounded by ``drain_seconds`` without progress,
   except while link n waits for a person (an approval or a question), which is never cut short.
3. **Terminate link n** with the reason ``conductor-agents: continued as <id>``. Its queue is deleted;
   a message accepted after the drain's last evaluation is dropped with it, and the SDK sender that
   pushed it sends it again to link n+1 (it waits for step 4 to know).
   Just before, a link n paused meanwhile pauses link n+1 (``keep_paused``): a listener paused while its
   switch was under way stays paused.
4. **Commit**: read link n's final state (its last model turn, the tasks after it, its variables),
   build the :class:`~conductor_agents._listener.carryover.CommitRecord` and write it as the carry task's output. The
   server keeps the first output written (a finished task ignores later updates), so two processes that
   commit at once agree on the first one; each reads it back. Link n+1's model then starts, with the
   carried-over conversation in its system prompt.

If link n ends on its own during the drain (the model finished, a stop, a cancel), the listener has
ended: link n+1 is terminated with ``conductor-agents: continuation abandoned`` and link n's outcome is
the listener's.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from .._common.clock import SYSTEM_CLOCK, Clock
from .._common.task_names import CARRY_TASK, MESSAGE_WAIT_MARK, MODEL_TASK_TYPE, TURN_TASK, is_message_wait
from .._liveness.server_fault import retry_if_server_fault
from .._teams.model_settings import ModelSettings, apply_model_settings, run_model
from .._tooldefs.tooldef import HUMAN, PULL_WORKFLOW_MESSAGES
from .._tracing import hooks as tracing
from .._tracing.carrier import START_KEY as TRACE_START_KEY
from .._wire.api import ConductorApi
from .._wire.starting import start_run
from .._wire.transport import HttpError
from ..agent import Agent
from ..continuation import Continuation
from ..errors import ConductorAgentsError, ExecutionNotFoundError
from ..result import RunStatus, TokenUsage
from .carryover import CommitRecord, build_record
from .chain import ABANDONED_REASON, continued_reason, is_continued
from .directory import Chain, Link
from .handover import delivery_lock
from .pausing import is_paused, pause_run, resume_run
from .signals import carry_signal

__all__ = ["LinkSpec", "Switch", "SwitchOutcome", "link_start_body"]

log = logging.getLogger("conductor_agents.continuation")

#: What :meth:`Switch.terminate_old` says of link n failed by the server's fault before it was ended, and retried.
_RETRIED = "retried"
#: The drain's verdict ("link n is at rest, its queue empty") holds this long: the run must be ended
#: within it, or it is drained again (``sending`` counts on it to know a message is safe).
QUIET_VALID_SECONDS = 5.0
#: Evaluations of a waiting wait-for-message task, more than when it was first seen, that prove one of them began
#: after that look (the first may have begun before it): link n's, after link n+1 exists, end the drain; a run's,
#: after it accepted a message, prove the message pulled (``sending``, ``delivery``).
EVALUATIONS_SINCE = 2
#: A wait-for-message task scheduled this long after link n+1 was created certainly began popping
#: after it (the margin covers the clocks of a cluster's nodes, which stamp the two times).
_SCHEDULED_AFTER_MARGIN_MS = 250
#: Pause between two reads of link n while draining it.
_DRAIN_PAUSE = 0.25
#: After link n is terminated, how long before its final state is read: a wait-for-message task that
#: was being evaluated when the run ended writes its output a moment later (what it popped then is
#: not in the record, so an SDK sender sends it again; this only narrows that window).
_SETTLE_SECONDS = 0.1
#: Attempts to end link n when a concurrent write keeps bringing it back (see ``terminate_old``).
_TERMINATE_ATTEMPTS = 5
#: How many tasks are read from the end of link n to find its last model turn (more pages if needed).
_TAIL_PAGE = 40
_HUMAN = "HUMAN"
_LLM = MODEL_TASK_TYPE
_LOOPS = frozenset({"DO_WHILE"})
#: Tasks of a waiting link that do not keep a switch from happening.
_WAITING_KINDS = frozenset({"JOIN", "DO_WHILE"})


@attrs.frozen
class LinkSpec:
    """What a link is started with: the agent, the listener's prompt and context, its turn budget, and the
    model settings of the listener's start (every link gets them)."""

    agent: Agent
    prompt: str
    continuation: Continuation
    context: Mapping[str, Any] = attrs.field(factory=dict)
    model_settings: ModelSettings | None = None
    #: The W3C traceparent of the listener's traced run its later runs' spans are children of (tracing on).
    trace_parent: str | None = None
    #: :func:`agent_key` of the agent, when the caller compiled its config already (else made from it).
    agent_key: str | None = None
    #: Its wait for messages is a ``HUMAN`` task its mailbox's forward completes (``listener_wait="human"``).
    human_wait: bool = False

    def key(self) -> str:
        """:func:`agent_key` of the spec's agent: the one given, or made (the agent compiled) now."""
        return self.agent_key if self.agent_key is not None else agent_key(self.agent.name, self.agent.to_config())


def agent_key(name: str, config: Mapping[str, Any]) -> str:
    """What the run sizes of agent ``name`` compiled to ``config`` (its ``to_config()``, without per-run
    model settings) are learned under: the same agent, the same key."""
    return f"{name}:{hash(json.dumps(config, sort_keys=True, default=str))}"


def link_start_body(spec: LinkSpec, run_id: str, key: str, *, number: int, turns_before: int,
                    traceparent: str | None = None, config: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``POST /agent/start`` body of link ``number`` of the listener on ``run_id`` (the first
    link included), started with idempotency key ``key``; ``config``: the agent's config with the
    spec's model settings applied, when the caller compiled it already.

    Every link reports each model turn to the serving process (a ``before_model`` callback, task
    :data:`~conductor_agents._common.task_names.TURN_TASK`); links after the first begin with the carry task.
    """
    config = dict(config) if config is not None else apply_model_settings(spec.agent.to_config(), spec.model_settings)
    config["maxTurns"] = max(1, spec.agent.max_turns - turns_before)
    if spec.human_wait:
        config["tools"] = [as_human_wait(t) for t in config.get("tools") or ()]
    callbacks = [c for c in config.get("callbacks") or () if c.get("position") != "before_model"]
    config["callbacks"] = [*callbacks, {"position": "before_model", "taskName": TURN_TASK}]
    if number > 0:
        config["prefillTools"] = [{"toolName": CARRY_TASK, "arguments": {}}]
    body: dict[str, Any] = {"agentConfig": config, "prompt": spec.prompt, "runId": run_id, "idempotencyKey": key}
    if spec.context:
        body["context"] = dict(spec.context)
    if traceparent is not None:
        body[TRACE_START_KEY] = traceparent  # where this run's span context is found again (_tracing.carrier)
    return body


def as_human_wait(tool: Mapping[str, Any]) -> Mapping[str, Any]:
    """A tool's config as sent for a listener that waits on a ``HUMAN`` task: its wait for messages becomes a
    ``human`` tool whose description ends with the mark that tells it from a question to a person (the server
    copies the description into the task's input); every other tool as it is."""
    if tool.get("toolType") != PULL_WORKFLOW_MESSAGES:
        return tool
    description = str(tool.get("description") or tool.get("name") or "")
    return {**tool, "toolType": HUMAN, "description": f"{description} {MESSAGE_WAIT_MARK}", "config": {}}


@attrs.frozen
class SwitchOutcome:
    """How a switch ended: committed (``record``), or abandoned because link n ended first."""

    new: Link
    record: CommitRecord | None = None
    abandoned_because: str | None = None  # link n's status when it ended on its own


#: A drain that keeps seeing progress goes on for at most this many times ``drain_seconds``.
DRAIN_CAP_FACTOR = 10


def carry_grace_seconds(drain_seconds: float) -> float:
    """How long a new run's carry task may wait unpolled before liveness counts it: the longest a
    switch's drain may take (the old run working off its backlog), and the few steps after it."""
    return DRAIN_CAP_FACTOR * drain_seconds + 30.0


def _seq(task: Mapping[str, Any]) -> int:
    try:
        return int(task.get("seq") or -1)
    except (TypeError, ValueError):
        return -1


def _is_waiting(tasks: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The waiting wait-for-message task (of either kind) when nothing else of the run is pending, else None."""
    pulls = [t for t in tasks if is_message_wait(t) and t.get("status") == "IN_PROGRESS"]
    others = [t for t in tasks if t.get("taskType") not in _WAITING_KINDS and not is_message_wait(t)]
    if len(pulls) != 1 or others:
        return None
    return pulls[0]


class Switch:
    """One switch of one chain from link ``old`` to link ``old + 1``; run by one thread.

    Args:
        locally_idle: whether this process runs no tool of a given execution right now.
        stopping: set when the runtime closes: the switch stops between steps (a later process
            completes it).
    """

    def __init__(self, api: ConductorApi, chain: Chain, old: Link, spec: LinkSpec, *, worker_id: str,
                 locally_idle: Callable[[str], bool] = lambda execution_id: True,
                 stopping: threading.Event | None = None, drain_seconds: float = 60.0,
                 clock: Clock = SYSTEM_CLOCK, pause: Callable[[float], bool] | None = None) -> None:
        self._api = api
        self.chain = chain
        self.old = old
        self.new = chain.link(old.number + 1)
        self._spec = spec
        self._worker_id = worker_id
        self._locally_idle = locally_idle
        self._stopping = stopping or threading.Event()
        self._drain_seconds = drain_seconds
        self._clock = clock
        self._pause = pause or self._stopping.wait
        self._new_created_ms: float | None = None  # when link n+1 began (the server's clock)
        self._quiet_at = float("-inf")  # when the drain last found link n at rest (this process's clock)
        self._signal_carried = False
        self.started = False  # link n+1 is known to exist (this process started it, or found it begun)

    # -- the steps --------------------------------------------------------------------

    def start_new(self, *, turns_before: int) -> None:
        """Step 1 (create-once)."""
        state = (self._api.workflow_status(self.old.execution_id, include_variables=True).get("variables")
                 or {}).get("_agent_state")
        spec = attrs.evolve(self._spec, context=state) if isinstance(state, Mapping) and state else self._spec
        assert self.chain.run_id is not None
        traced = tracing.begin_run(spec.agent.name, parent=spec.trace_parent, owner=self._worker_id,
                                   model=run_model(spec.agent.model, spec.model_settings))
        body = link_start_body(spec, self.chain.run_id, self.chain.key(self.new.number).key,
                               number=self.new.number, turns_before=turns_before, traceparent=traced.traceparent)
        try:  # a start whose answer was lost is sent again (create-once: the key names the link)
            started = start_run(self._api, body, pause=self._pause)
        except BaseException as err:
            traced.failed(err)
            raise
        traced.started(str(started.get("executionId")), conversation_id=self.chain.execution_id)
        if str(started.get("executionId")) != self.new.execution_id:
            raise ConductorAgentsError(
                f"the server started link {self.new.number} of listener {self.chain.execution_id} as "
                f"{started.get('executionId')}, not {self.new.execution_id}: this server derives idempotent "
                "run ids differently, so continued listeners cannot be found again; continuation is off "
                "for this listener")
        log.info("listener %s: link %d (%s) started to continue %s", self.chain.execution_id, self.new.number,
                 self.new.execution_id, self.old.execution_id)
        self.started = True
        self._carry_signal()

    def _carry_signal(self) -> None:
        """Link n+1 is live from now on (a ``signal()`` reaches it directly): the standing signal of link n goes
        on in it (once per switch and process: also when this process finishes a switch another one began)."""
        if not self._signal_carried:
            carry_signal(self._api, self.old.execution_id, self.new.execution_id, pause=self._pause)
            self._signal_carried = True

    def drain(self) -> tuple[str, str | None]:
        """Step 2: ``("quiet", None)``, ``("timeout", None)``, ``("ended", status)`` or ``("stopping", None)``.

        The bound counts from the last sign of progress (a task of link n that was not there before,
        or one of its tools running here): a backlog in its queue is worked off however long it
        takes; only a link that makes no progress for ``drain_seconds`` (or keeps busy ten times that
        long: a sender that bypasses the SDK never stops) is cut short. Progress is read from the
        tasks' sequence numbers, not from catching the link at a wait: working off a backlog, each
        wait ends as soon as it is looked at, and a sample between two reads would rarely see one.
        """
        now = self._clock.monotonic()
        deadline, hard_deadline = now + self._drain_seconds, now + DRAIN_CAP_FACTOR * self._drain_seconds
        pull_id: str | None = None
        newest_seq = -1
        first_count = 0
        last_shape: object = None
        while True:
            status = self._api.agent_status(self.old.execution_id)
            run_status = RunStatus.parse(status.get("status"))
            if run_status.is_terminal:
                reason = status.get("reasonForIncompletion")
                if is_continued(reason):  # ended by this switch already (a process that died after step 3)
                    self._quiet_at = self._clock.monotonic()
                    return "quiet", None
                if retry_if_server_fault(self._api, self.old.execution_id, seen=status):
                    continue  # the server failed it for want of writing its tasks: retried, it drains on
                return "ended", run_status.value
            with delivery_lock(str(self.chain.run_id)):  # no forward completes link n's wait while it is read
                page = self._api.workflow_tasks(self.old.execution_id, statuses=("IN_PROGRESS", "SCHEDULED"),
                                                start=1, count=50)  # start=1: the loop, first and big
            seq = max((_seq(t) for t in page.tasks), default=-1)
            idle = self._locally_idle(self.old.execution_id)
            if seq > newest_seq or not idle:  # a new task (the link moved on), or its tool runs here
                newest_seq = max(seq, newest_seq)
                deadline = max(deadline, self._clock.monotonic() + self._drain_seconds)
            if any(t.get("taskType") == _HUMAN and not is_message_wait(t) for t in page.tasks):
                # It waits for a person (an approval, a question): never cut that short; the new run
                # holds the messages that come meanwhile.
                now = self._clock.monotonic()
                deadline, hard_deadline = now + self._drain_seconds, now + DRAIN_CAP_FACTOR * self._drain_seconds
            pull = _is_waiting(page.tasks)
            shape = (tuple(sorted(f"{t.get('taskType')}:{t.get('status')}" for t in page.tasks)), idle)
            if shape != last_shape:
                last_shape = shape
                log.debug("listener %s: draining link %d: %s; %s here", self.chain.execution_id, self.old.number,
                          ", ".join(shape[0]) or "nothing pending", "idle" if idle else "busy")
            if pull is not None and idle and pull.get("taskType") == _HUMAN:
                # A wait on a HUMAN task: only this process's forward completes it, and only the newest link's,
                # which link n no longer is: at rest for good (nothing is queued in link n).
                self._quiet_at = self._clock.monotonic()
                return "quiet", None
            if pull is not None and idle:
                count = int(pull.get("pollCount") or 0)
                if (count >= 1 and self._scheduled_after_new(pull)) or \
                        (pull.get("taskId") == pull_id and count >= first_count + EVALUATIONS_SINCE):
                    self._quiet_at = self._clock.monotonic()
                    return "quiet", None
                if pull.get("taskId") != pull_id:
                    pull_id, first_count = str(pull.get("taskId")), count
            else:
                pull_id = None  # it is acting on a message: start counting again at its next wait
            if self._clock.monotonic() >= min(deadline, hard_deadline):
                return "timeout", None
            if self._pause(_DRAIN_PAUSE):
                return "stopping", None

    def _scheduled_after_new(self, pull: Mapping[str, Any]) -> bool:
        if self._new_created_ms is None:
            carry = self._carry_task(self.new.execution_id)
            scheduled = (carry or {}).get("scheduledTime")
            if not isinstance(scheduled, (int, float)) or scheduled <= 0:
                return False
            self._new_created_ms = float(scheduled)
        scheduled = pull.get("scheduledTime")
        return isinstance(scheduled, (int, float)) and scheduled > self._new_created_ms + _SCHEDULED_AFTER_MARGIN_MS

    def keep_paused(self) -> None:
        """Before step 3: a listener paused while this switch was under way stays paused across it.

        ``pause()`` pauses every run it finds, then looks once more for a newer one; a pause that read the listener
        before link n+1 began, and looked again before it began too, paused link n alone. So link n paused means
        link n+1 is paused as well, before link n ends (it takes no turn until unpaused). Then link n is read again:
        an ``unpause()`` that came meanwhile may have read link n+1 before this pause, so it is resumed here (and an
        unpause after this read finds it paused).
        """
        if not is_paused(self._api, self.old.execution_id):
            return
        pause_run(self._api, self.new.execution_id)
        if is_paused(self._api, self.old.execution_id):
            log.info("listener %s: link %d paused with the link it continues", self.chain.execution_id,
                     self.new.number)
        else:
            resume_run(self._api, self.new.execution_id)

    def terminate_old(self) -> str | None:
        """Step 3. Returns None, or the status link n ended with on its own (the switch is off).

        Link n read back still running means a write that read it before the end (the server's stop
        rewrites the whole run, without a lock) undid the end: it is ended again, a few times at most.
        """
        for attempt in range(_TERMINATE_ATTEMPTS):
            try:
                self._api.cancel_agent(self.old.execution_id, continued_reason(self.new.execution_id))
            except HttpError as err:
                if err.status not in (409, 400):
                    raise
            status = self._api.agent_status(self.old.execution_id)
            if is_continued(status.get("reasonForIncompletion")):
                return None
            if retry_if_server_fault(self._api, self.old.execution_id, seen=status):
                return _RETRIED  # failed by the server's fault before it was ended, and retried: drained again
            if RunStatus.parse(status.get("status")).is_terminal:
                return str(status.get("status"))
            log.info("listener %s: link %s still %s after it was ended (attempt %d): ending it again",
                     self.chain.execution_id, self.old.execution_id, status.get("status"), attempt + 1)
            self._pause(_SETTLE_SECONDS)
        raise ConductorAgentsError(f"link {self.old.execution_id} of listener {self.chain.execution_id} is still "
                                   f"running after {_TERMINATE_ATTEMPTS} attempts to end it for its continuation")

    def commit(self) -> CommitRecord:
        """Step 4: build the record from link n's final state, write it (first writer wins), read it back."""
        self._pause(_SETTLE_SECONDS)
        carry = self._carry_task(self.new.execution_id)
        if carry is None:
            raise ConductorAgentsError(f"link {self.new.execution_id} has no carry task to commit")
        if carry.get("status") == "COMPLETED":
            record = CommitRecord.from_output(carry.get("outputData"))
            if record is not None:
                return record
        record = self._build()
        self._api.update_task({
            "workflowInstanceId": self.new.execution_id, "taskId": str(carry["taskId"]), "status": "COMPLETED",
            "outputData": record.to_output(), "workerId": self._worker_id,
        })
        written = CommitRecord.from_output(self._api.get_task(str(carry["taskId"])).get("outputData"))
        if written is None:
            raise ConductorAgentsError(f"the carry task of {self.new.execution_id} holds no record after the commit")
        log.info("listener %s: link %d committed (%d messages pulled by the old run, %d pending)",
                 self.chain.execution_id, self.new.number, len(written.pulled), len(written.pending))
        return written

    def abandon(self, because: str) -> None:
        """Link n ended on its own: end link n+1, which never took a turn."""
        try:
            self._api.cancel_agent(self.new.execution_id, f"{ABANDONED_REASON}: the previous run {because}")
        except HttpError as err:
            if err.status not in (409, 400):
                raise
        log.info("listener %s: continuation to link %d abandoned (the previous run %s)", self.chain.execution_id,
                 self.new.number, because)

    # -- all of it ----------------------------------------------------------------------

    def run(self, *, turns_before: int, started: bool = False) -> SwitchOutcome | None:
        """Every step from the first not yet done; None when the runtime began closing meanwhile."""
        if not started:
            self.start_new(turns_before=turns_before)
        return self.finish()

    def finish(self) -> SwitchOutcome | None:
        """Steps 2-4 (a switch another process began, found by :func:`pending_switch`, or this one)."""
        began = self._clock.monotonic()
        self._carry_signal()  # a switch another process began may have ended before its carry
        state, ended = self.drain()
        drained = self._clock.monotonic()
        if state == "stopping":
            return None
        if state == "ended":
            self.abandon(str(ended).lower())
            return SwitchOutcome(self.new, abandoned_because=ended)
        if state == "timeout":
            log.warning("listener %s: link %s did not come to rest (no progress for %.0fs, or busy for ten times "
                        "that: messages keep arriving from a sender that does not use this SDK?); continuing it "
                        "anyway: messages still in its queue are dropped", self.chain.execution_id,
                        self.old.execution_id, self._drain_seconds)
        if state == "quiet" and self._clock.monotonic() - self._quiet_at > QUIET_VALID_SECONDS:
            return self.finish()  # too long since the drain looked (a stalled process): look again
        self.keep_paused()
        ended = self.terminate_old()
        if ended == _RETRIED:
            return self.finish()
        if ended is not None:
            self.abandon(ended.lower())
            return SwitchOutcome(self.new, abandoned_because=ended)
        terminated = self._clock.monotonic()
        new_status = RunStatus.parse(self._api.workflow_status(self.new.execution_id).get("status"))
        if new_status.is_terminal:  # the listener was cancelled meanwhile (its new run with it)
            log.info("listener %s: link %d ended (%s) before its switch was committed", self.chain.execution_id,
                     self.new.number, new_status.value)
            return SwitchOutcome(self.new, abandoned_because=new_status.value)
        record = self.commit()
        log.debug("listener %s: link %d drained in %.2fs, terminated in %.2fs, committed in %.2fs",
                  self.chain.execution_id, self.new.number, drained - began, terminated - drained,
                  self._clock.monotonic() - terminated)
        return SwitchOutcome(self.new, record=record)

    # -- reading link n ---------------------------------------------------------------

    def _carry_task(self, execution_id: str) -> Mapping[str, Any] | None:
        page = self._api.workflow_tasks(execution_id, start=0, count=5)
        for task in page.tasks:
            if task.get("taskType") == CARRY_TASK:
                return task
        return None

    def _build(self) -> CommitRecord:
        old_id = self.old.execution_id
        last_llm, tail, variables = read_final_state(self._api, old_id)
        earlier = None
        if self.old.number > 0:
            carry = self._carry_task(old_id)
            earlier = CommitRecord.from_output((carry or {}).get("outputData"))
        return build_record(continuation=self._spec.continuation, prompt=self._spec.prompt, previous_id=old_id,
                            new_link=self.new.number, earlier=earlier, last_llm=last_llm, tail=tail,
                            variables=variables, tokens=run_tokens(self._api, old_id))


def run_tokens(api: ConductorApi, execution_id: str) -> TokenUsage:
    """The model tokens one run used, as the server counted them (zeros when it cannot say)."""
    try:
        return TokenUsage.from_dict(api.agent_execution(execution_id).get("tokenUsage"))
    except ConductorAgentsError as err:
        log.debug("run %s: token usage unreadable (%s)", execution_id, err)
        return TokenUsage()


def read_final_state(api: ConductorApi, execution_id: str) -> tuple[dict[str, Any] | None, list[Any], dict[str, Any]]:
    """A link's last finished model turn, the tasks after it, and its variables (a few pages, not all)."""
    total = api.workflow_tasks(execution_id, start=0, count=1).total
    tail: list[Any] = []
    last_llm = None
    start = total
    while start > 0 and last_llm is None:
        start = max(0, start - _TAIL_PAGE)
        page = api.workflow_tasks(execution_id, start=start, count=_TAIL_PAGE)
        tail = [t for t in page.tasks if t.get("taskType") not in _LOOPS] + tail
        done = [t for t in tail if t.get("taskType") == _LLM and t.get("status") == "COMPLETED"]
        last_llm = max(done, key=lambda t: int(t.get("seq") or 0)) if done else None
    variables = api.workflow_status(execution_id, include_variables=True).get("variables") or {}
    return last_llm, tail, variables


def pending_switch(api: ConductorApi, chain: Chain, newest: Link) -> Link | None:
    """The link a switch to ``newest`` continues, when that switch is not committed yet (else None).

    A newest link whose carry task is unfinished while the run is still going: the process that
    began the switch died (or is still at it).
    """
    if newest.number <= chain.first:
        return None
    try:
        status = api.workflow_status(newest.execution_id)
    except ExecutionNotFoundError:
        return None
    if RunStatus.parse(status.get("status")).is_terminal:
        return None
    page = api.workflow_tasks(newest.execution_id, start=0, count=5)
    for task in page.tasks:
        if task.get("taskType") == CARRY_TASK:
            return None if task.get("status") == "COMPLETED" else chain.link(newest.number - 1)
    if page.total <= len(page.tasks) and not any(task.get("taskType") == MODEL_TASK_TYPE for task in page.tasks):
        # Every link after the first begins with its carry task: a running one whose every task is here, with
        # neither the carry nor a model turn, is a switch just begun whose carry the server has not scheduled
        # yet (a busy server's first tasks); taking it for committed would leave the switch unfinished.
        return chain.link(newest.number - 1)
    return None


def read_commit(api: ConductorApi, new: Link) -> tuple[CommitRecord | None, bool]:
    """Link ``new``'s commit record (None if not committed yet) and whether it can still be committed."""
    try:
        page = api.workflow_tasks(new.execution_id, start=0, count=5)
    except ExecutionNotFoundError:
        return None, False
    for task in page.tasks:
        if task.get("taskType") == CARRY_TASK:
            if task.get("status") == "COMPLETED":
                return CommitRecord.from_output(task.get("outputData")), False
            return None, task.get("status") in ("SCHEDULED", "IN_PROGRESS")
    return None, False
