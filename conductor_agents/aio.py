"""The async face: :class:`AsyncAgentRuntime` and :class:`AsyncAgentHandle`, awaitable twins of the runtime's
and the handle's verbs, for asyncio code (FastAPI, Starlette, a notebook's running loop).

The SDK's core is synchronous and threaded (its pollers, tool pool and watchdog are threads either way);
this face runs each blocking verb on a thread pool of its own, so the event loop never waits on the server.
One exception: a handle of :meth:`AsyncAgentRuntime.get_handle` (no request, so not awaitable) reads its run
once, blocking, on the first access to ``agent_name`` or ``run_id``; a coroutine that needs those at once
takes its handle with ``await runtime.attach(id)``, which reads the run on the pool.
The same arguments, results and errors as the synchronous verbs (see :class:`~conductor_agents.AgentRuntime`
and :class:`~conductor_agents.AgentHandle`); ``events()`` is an async iterator. As in the synchronous face,
the runtime's verbs on one run by its id are its handle's (:meth:`AsyncAgentRuntime.get_handle`, no request),
each wrapping the synchronous handle's verb once.

Cancelling an awaiting task gives the loop back at once. The thread under it ends by itself: a
``wait()`` is sliced (at most :data:`WAIT_SLICE_SECONDS` a piece), so a cancelled one lets its thread go
within that; an ``events()`` iterator that is closed or cancelled closes its connection. A verb that
changes something (``send_message``, ``stop``, ``approve`` ...) still completes on the server after its
awaiter was cancelled, like a request already sent.

Thread-safety: an :class:`AsyncAgentRuntime` may be used from any number of tasks of one loop at once (and
from several loops); it holds no loop. ``max_threads`` bounds the threads of its pool: verbs beyond that
wait their turn (each waiting ``wait()`` takes one thread for at most a slice, then yields it).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import functools
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from ._common.checks import A_TIMEOUT, an_int
from ._common.fork import rebuild_after_fork
from ._common.public import publish as _publish
from ._listener.delivery import MessageDelivery
from ._listener.running import RunningRun
from ._people.pending import HumanAnswer, PendingRequest
from ._scheduling import Schedule, Schedules
from ._teams.model_settings import ModelSettings
from .agent import Agent
from .errors import WaitTimeoutError
from .events import AgentEvent
from .handle import AgentHandle
from .result import AgentResult, AgentStatus, ListenerTotals
from .runtime import AgentRuntime
from .settings import AgentSettings
from .stats import RunStats, RuntimeStats

__all__ = ["AsyncAgentHandle", "AsyncAgentRuntime", "AsyncEvents", "AsyncSchedules", "WAIT_SLICE_SECONDS"]

T = TypeVar("T")

#: The longest one thread blocks in ``wait()`` before the awaiting coroutine looks again (a cancelled
#: ``wait()`` frees its thread within this).
WAIT_SLICE_SECONDS = 5.0
#: Default size of an async runtime's thread pool.
DEFAULT_MAX_THREADS = 32
_END = object()


class _Pool:
    """The threads an async runtime runs blocking verbs on; made again in a forked child."""

    def __init__(self, max_threads: int) -> None:
        self.max_threads = an_int(at_least=1).check("max_threads", max_threads)
        self._executor = self._make()
        rebuild_after_fork(self)

    def _make(self) -> concurrent.futures.ThreadPoolExecutor:
        return concurrent.futures.ThreadPoolExecutor(self.max_threads, thread_name_prefix="conductor-agents-async")

    def _after_fork_in_child(self) -> None:
        self._executor = self._make()  # the parent's threads do not exist here

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` on a pool thread, in the caller's context (contextvars)."""
        call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    def close(self) -> None:
        """Take no more verbs and drop those not begun (a :class:`~._common.parts.Part`; its threads end once
        their verb returns: a ``wait()`` within a slice). Idempotent."""
        self._executor.shutdown(wait=False, cancel_futures=True)


class AsyncAgentRuntime:
    """An :class:`~conductor_agents.AgentRuntime` with awaitable verbs.

    ``AsyncAgentRuntime(settings, **kwargs)`` makes its own runtime (the same arguments as
    ``AgentRuntime``); ``AsyncAgentRuntime(runtime=rt)`` wraps one that exists (closing this closes it).
    Use ``async with`` or ``await close()``. :attr:`sync` is the synchronous runtime under it.
    """

    def __init__(self, settings: AgentSettings | None = None, *, runtime: AgentRuntime | None = None,
                 max_threads: int = DEFAULT_MAX_THREADS, **kwargs: Any) -> None:
        """Make an async runtime: over a new :class:`AgentRuntime`, or over ``runtime``.

        Args:
            settings: as :class:`AgentRuntime` (default :meth:`AgentSettings.from_env`).
            runtime: an :class:`AgentRuntime` to wrap instead of making one (closing this closes it);
                not with ``settings`` or ``kwargs``.
            max_threads: the threads of its pool, which runs the blocking verbs (32); verbs beyond
                that wait their turn.
            **kwargs: the other arguments of :class:`AgentRuntime` (``on_stall``, ``on_pending``,
                ``transport``, ``clock``).

        Raises:
            ValueError: ``runtime`` with ``settings`` or ``kwargs``, or ``max_threads`` < 1.
            ConfigurationError, AgentTypeError: as :class:`AgentRuntime`.
        """
        if runtime is not None and (settings is not None or kwargs):
            raise ValueError("pass either runtime= or the settings to make one, not both")
        self._pool = _Pool(max_threads)
        self.sync: AgentRuntime = runtime if runtime is not None else AgentRuntime(settings, **kwargs)

    @property
    def settings(self) -> AgentSettings:
        return self.sync.settings

    def __repr__(self) -> str:
        return f"Async{self.sync!r}"

    async def __aenter__(self) -> AsyncAgentRuntime:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    def _handle(self, handle: AgentHandle) -> AsyncAgentHandle:
        return AsyncAgentHandle(handle, self._pool, wait_timeout=self.settings.wait_timeout_seconds)

    # -- runs -------------------------------------------------------------------------

    async def start(self, agent: Agent, prompt: str, *, idempotency_key: str | None = None,
                    context: Mapping[str, Any] | None = None, media: Any | None = None,
                    model_settings: ModelSettings | None = None) -> AsyncAgentHandle:
        """As :meth:`AgentRuntime.start`."""
        return self._handle(await self._pool.run(self.sync.start, agent, prompt, idempotency_key=idempotency_key,
                                                 context=context, media=media, model_settings=model_settings))

    async def run(self, agent: Agent, prompt: str, *, timeout: float = 600.0, idempotency_key: str | None = None,
                  context: Mapping[str, Any] | None = None, media: Any | None = None,
                  model_settings: ModelSettings | None = None) -> AgentResult:
        """As :meth:`AgentRuntime.run`: start, then ``await handle.wait(timeout)``."""
        handle = await self.start(agent, prompt, idempotency_key=idempotency_key, context=context, media=media,
                                  model_settings=model_settings)
        return await handle.wait(timeout=timeout)

    def get_handle(self, execution_id: str) -> AsyncAgentHandle:
        """As :meth:`AgentRuntime.get_handle`: no request, so not awaitable. Its ``agent_name`` and ``run_id``
        read the run once, blocking, on first access: use ``await attach(execution_id)`` to have them at once."""
        return self._handle(self.sync.get_handle(execution_id))

    async def send_message(self, execution_id: str, payload: Any) -> str:
        """As :meth:`AgentRuntime.send_message`: :meth:`AsyncAgentHandle.send_message` of :meth:`get_handle`."""
        return await self.get_handle(execution_id).send_message(payload)

    async def signal(self, execution_id: str, text: str) -> None:
        """As :meth:`AgentRuntime.signal`: :meth:`AsyncAgentHandle.signal` of :meth:`get_handle`."""
        await self.get_handle(execution_id).signal(text)

    async def wait_delivered(self, execution_id: str, message_id: str,
                             timeout: float | None = None) -> MessageDelivery:
        """As :meth:`AgentRuntime.wait_delivered`: :meth:`AsyncAgentHandle.wait_delivered` of :meth:`get_handle`."""
        return await self.get_handle(execution_id).wait_delivered(message_id, timeout=timeout)

    async def attach(self, execution_id: str) -> AsyncAgentHandle:
        """As :meth:`AgentRuntime.attach`."""
        return self._handle(await self._pool.run(self.sync.attach, execution_id))

    async def resume(self, execution_id: str, agent: Agent, *, force: bool = False) -> AsyncAgentHandle:
        """As :meth:`AgentRuntime.resume`."""
        return self._handle(await self._pool.run(self.sync.resume, execution_id, agent, force=force))

    async def serve(self, agent: Agent, *, on_adopt: Callable[[AgentHandle], Any] | None = None) -> None:
        """As :meth:`AgentRuntime.serve` (``on_adopt`` is called on a worker thread with the sync handle)."""
        await self._pool.run(self.sync.serve, agent, on_adopt=on_adopt)

    # -- people in the loop -----------------------------------------------------------

    async def pending(self, execution_id: str) -> tuple[PendingRequest, ...]:
        """As :meth:`AgentRuntime.pending`: :meth:`AsyncAgentHandle.pending` of :meth:`get_handle`."""
        return await self.get_handle(execution_id).pending()

    async def running(self, agent: Agent | str) -> tuple[RunningRun, ...]:
        """As :meth:`AgentRuntime.running`."""
        return await self._pool.run(self.sync.running, agent)

    @property
    def schedules(self) -> AsyncSchedules:
        """As :attr:`AgentRuntime.schedules`, each verb awaitable."""
        return AsyncSchedules(self.sync.schedules, self._pool)

    async def pending_requests(self, agent: Agent | str) -> tuple[PendingRequest, ...]:
        """As :meth:`AgentRuntime.pending_requests`."""
        return await self._pool.run(self.sync.pending_requests, agent)

    async def approve(self, execution_id: str, **kwargs: Any) -> HumanAnswer:
        """As :meth:`AgentRuntime.approve` (``reason``, ``by``, ``request``, ``timeout``): the async handle's."""
        return await self.get_handle(execution_id).approve(**kwargs)

    async def reject(self, execution_id: str, reason: str, **kwargs: Any) -> HumanAnswer:
        """As :meth:`AgentRuntime.reject` (``by``, ``request``, ``timeout``): the async handle's."""
        return await self.get_handle(execution_id).reject(reason, **kwargs)

    async def respond(self, execution_id: str, answer: Any, **kwargs: Any) -> HumanAnswer:
        """As :meth:`AgentRuntime.respond` (``by``, ``request``, ``timeout``): the async handle's."""
        return await self.get_handle(execution_id).respond(answer, **kwargs)

    def stats(self) -> RuntimeStats:
        """As :meth:`AgentRuntime.stats` (no request: not awaitable)."""
        return self.sync.stats()

    async def close(self) -> None:
        """As :meth:`AgentRuntime.close` (lets running tools finish, joins threads), off the loop. Idempotent."""
        try:
            await self._pool.run(self.sync.close)
        finally:
            self._pool.close()


class AsyncAgentHandle:
    """An :class:`~conductor_agents.AgentHandle` with awaitable verbs; :attr:`sync` is the handle under it."""

    def __init__(self, handle: AgentHandle, pool: _Pool, *, wait_timeout: float) -> None:
        self.sync = handle
        self._pool = pool
        self._wait_timeout = wait_timeout  # the settings' wait_timeout_seconds: wait()'s default

    @property
    def execution_id(self) -> str:
        return self.sync.execution_id

    @property
    def current_execution_id(self) -> str:
        return self.sync.current_execution_id

    @property
    def run_id(self) -> str | None:
        """As :attr:`AgentHandle.run_id` (a handle of :meth:`AsyncAgentRuntime.get_handle`: read once, blocking)."""
        return self.sync.run_id

    @property
    def agent_name(self) -> str:
        """As :attr:`AgentHandle.agent_name` (read as :attr:`run_id` is)."""
        return self.sync.agent_name

    def __repr__(self) -> str:
        return f"Async{self.sync!r}"

    async def status(self) -> AgentStatus:
        """As :meth:`AgentHandle.status`."""
        return await self._pool.run(self.sync.status)

    async def totals(self) -> ListenerTotals:
        """As :meth:`AgentHandle.totals`."""
        return await self._pool.run(self.sync.totals)

    async def wait(self, timeout: float | None = None) -> AgentResult:
        """As :meth:`AgentHandle.wait`; its thread blocks for a slice at a time (see the module)."""
        limit = self._wait_timeout if timeout is None else float(A_TIMEOUT.check("timeout", timeout))
        deadline = time.monotonic() + limit
        while True:
            remaining = deadline - time.monotonic()
            piece = max(0.001, min(WAIT_SLICE_SECONDS, remaining))
            try:
                return await self._pool.run(self.sync.wait, timeout=piece)
            except WaitTimeoutError as err:
                if deadline - time.monotonic() > 0:
                    continue
                raise WaitTimeoutError(
                    f"run {self.execution_id} did not end within {limit:g}s; it goes on on the server and is not "
                    "cancelled (call wait() again, stop() or cancel())",
                    execution_id=err.execution_id, timeout=limit) from None

    def events(self, timeout: float | None = None) -> AsyncEvents:
        """As :meth:`AgentHandle.events`, as an async iterator (``async for``; ``aclose()`` or ``async with``)."""
        return AsyncEvents(lambda: self.sync.events(timeout=timeout), self._pool)

    def stats(self) -> RunStats:
        """As :meth:`AgentHandle.stats` (no request: not awaitable)."""
        return self.sync.stats()

    async def send_message(self, payload: Any) -> str:
        """As :meth:`AgentHandle.send_message`."""
        return await self._pool.run(self.sync.send_message, payload)

    async def signal(self, text: str) -> None:
        """As :meth:`AgentHandle.signal`."""
        await self._pool.run(self.sync.signal, text)

    async def wait_delivered(self, message_id: str, timeout: float | None = None) -> MessageDelivery:
        """As :meth:`AgentHandle.wait_delivered`."""
        return await self._pool.run(self.sync.wait_delivered, message_id, timeout=timeout)

    async def stop(self) -> None:
        """As :meth:`AgentHandle.stop`."""
        await self._pool.run(self.sync.stop)

    async def cancel(self, reason: str = "cancelled by the caller") -> None:
        """As :meth:`AgentHandle.cancel`."""
        await self._pool.run(self.sync.cancel, reason)

    async def pause(self) -> None:
        """As :meth:`AgentHandle.pause`."""
        await self._pool.run(self.sync.pause)

    async def unpause(self) -> None:
        """As :meth:`AgentHandle.unpause`."""
        await self._pool.run(self.sync.unpause)

    async def pending(self) -> tuple[PendingRequest, ...]:
        """As :meth:`AgentHandle.pending`."""
        return await self._pool.run(self.sync.pending)

    async def approve(self, **kwargs: Any) -> HumanAnswer:
        """As :meth:`AgentHandle.approve` (``reason``, ``by``, ``request``, ``timeout``)."""
        return await self._pool.run(self.sync.approve, **kwargs)

    async def reject(self, reason: str, **kwargs: Any) -> HumanAnswer:
        """As :meth:`AgentHandle.reject` (``by``, ``request``, ``timeout``)."""
        return await self._pool.run(self.sync.reject, reason, **kwargs)

    async def respond(self, answer: Any, **kwargs: Any) -> HumanAnswer:
        """As :meth:`AgentHandle.respond` (``by``, ``request``, ``timeout``)."""
        return await self._pool.run(self.sync.respond, answer, **kwargs)


class AsyncEvents:
    """A run's events as an async iterator: a thread of its own reads the synchronous iterator and hands
    each event to the loop. Closing it (``aclose()``, ``async with``, a cancelled ``async for``) closes the
    connection and lets the thread end."""

    def __init__(self, open_events: Callable[[], Any], pool: _Pool) -> None:
        self._open = open_events
        self._pool = pool
        self._events: Any = None
        self._queue: asyncio.Queue[Any] | None = None
        self._thread: threading.Thread | None = None
        self._closed = False

    def __aiter__(self) -> AsyncEvents:
        return self

    async def __aenter__(self) -> AsyncEvents:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def __anext__(self) -> AgentEvent:
        if self._closed:
            raise StopAsyncIteration
        if self._queue is None:
            await self._begin()
        assert self._queue is not None
        try:
            item = await self._queue.get()
        except asyncio.CancelledError:
            await asyncio.shield(self.aclose())
            raise
        if item is _END:
            self._closed = True
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            self._closed = True
            raise item
        event: AgentEvent = item
        return event

    async def _begin(self) -> None:
        loop = asyncio.get_running_loop()
        self._events = await self._pool.run(self._open)
        queue: asyncio.Queue[Any] = asyncio.Queue()
        self._queue = queue

        def hand(item: Any) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody reads any more
                loop.call_soon_threadsafe(queue.put_nowait, item)

        def read(events: Any = self._events) -> None:
            try:
                for event in events:
                    hand(event)
                hand(_END)
            except BaseException as err:  # noqa: BLE001 (handed to the awaiting coroutine, raised there)
                hand(err)

        self._thread = threading.Thread(target=read, name=f"conductor-agents-async-events-{os.getpid()}",
                                        daemon=True)
        self._thread.start()

    async def aclose(self) -> None:
        """Stop reading and close the connection. Idempotent."""
        self._closed = True
        events, thread = self._events, self._thread
        if events is not None:
            events.close()  # thread-safe: unblocks a read in progress
        if thread is not None:
            await self._pool.run(thread.join, 10.0)


class AsyncSchedules:
    """:class:`~conductor_agents.Schedules` with every verb awaitable (``runtime.schedules`` of the async face)."""

    def __init__(self, schedules: Schedules, pool: _Pool) -> None:
        self.sync = schedules
        self._pool = pool

    def __repr__(self) -> str:
        return "AsyncSchedules()"

    async def create(self, agent: Agent, prompt: str, **kwargs: Any) -> Schedule:
        """As :meth:`Schedules.create` (``name``, ``cron``, ``zone``, ``context``, ``paused``, ``description``)."""
        return await self._pool.run(self.sync.create, agent, prompt, **kwargs)

    async def get(self, name: str) -> Schedule:
        """As :meth:`Schedules.get`."""
        return await self._pool.run(self.sync.get, name)

    async def list(self, agent: Agent | str | None = None) -> tuple[Schedule, ...]:
        """As :meth:`Schedules.list`."""
        return await self._pool.run(self.sync.list, agent)

    async def pause(self, name: str) -> Schedule:
        """As :meth:`Schedules.pause`."""
        return await self._pool.run(self.sync.pause, name)

    async def unpause(self, name: str) -> Schedule:
        """As :meth:`Schedules.unpause`."""
        return await self._pool.run(self.sync.unpause, name)

    async def delete(self, name: str) -> bool:
        """As :meth:`Schedules.delete`."""
        return await self._pool.run(self.sync.delete, name)


# Reprs, tracebacks and pickles say conductor_agents.aio (the package's own publish, which runs after this
# module, names the two it re-exports at the top level conductor_agents).
_publish(globals(), __name__)
