"""ScriptedLLM: a fake OpenAI Responses API on loopback, so agents run offline and repeatably."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable
from typing import Any

from conductor_agents._common.clock import SYSTEM_CLOCK, Clock
from conductor_agents.testing._errors import ScriptedLLMStateError
from conductor_agents.testing._http import THREAD_NAME, LoopbackServer, Responder
from conductor_agents.testing._llm_request import LLMRequest
from conductor_agents.testing._scripts import PROVIDER_PREFIX, Anomaly, Policy, ScriptBook
from conductor_agents.testing._turns import Failure

__all__ = ["ScriptedLLM"]

_log = logging.getLogger("conductor_agents.testing")

#: The API key handed to the Conductor server; the fake accepts any key.
API_KEY = "scripted-llm"


class ScriptedLLM:
    """A scripted stand-in for an OpenAI model, served over HTTP on loopback.

    Point a Conductor server at it (``server_env()``), register a script per agent with
    :meth:`script`, and use the model string it returns in the agent. Requests are routed
    by model, so one ScriptedLLM can serve many agents and tests at once. Every request is
    recorded; every answer is HTTP 200 unless a failure is scripted. When the fake cannot
    answer from a script (unknown model, script used up, policy error) it still answers 200
    with a final text saying so, and records an :class:`Anomaly`, so the run ends instead of
    hanging and the test can fail with a clear message.

    Lifecycle: ``start()`` once, ``stop()`` any number of times (also safe before start), or
    use it as a context manager. It owns one serving thread named
    ``conductor-agents-scripted-llm`` and short-lived request threads named
    ``conductor-agents-scripted-llm-request``; ``stop()`` joins them all with a deadline.

    Thread-safe: every method may be called from any thread, including from a policy.

    Not shared across ``fork()``: it serves from the process that started it. In a forked
    child its scripts and records are a stale copy the server never sees, so scripting or
    inspecting it there raises :class:`ScriptedLLMStateError`; its address (``base_url``,
    ``server_env()``) still works, and ``stop()`` only releases the child's copy of the socket.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        clock: Clock = SYSTEM_CLOCK,
        start_timeout: float = 5.0,
        stop_timeout: float = 5.0,
    ) -> None:
        """Prepare the fake; nothing listens until :meth:`start`. ``port=0`` picks a free port."""
        #: Where to listen; keep it on loopback.
        self._address = (host, port)
        #: The longest ``start()`` waits for the serving thread to run.
        self._start_timeout = start_timeout
        #: The longest ``stop()`` waits for the serving thread and in-flight requests.
        self._stop_timeout = stop_timeout
        self._clock = clock
        self._book = ScriptBook(clock)
        self._lock = threading.Lock()
        self._stop_event = threading.Event()
        self._ready = threading.Event()
        self._httpd: LoopbackServer | None = None
        self._thread: threading.Thread | None = None
        self._started = False
        self._stopped = False
        self._owner_pid: int | None = None

    # --- lifecycle ------------------------------------------------------------------

    def start(self) -> ScriptedLLM:
        """Bind the port and start serving; returns ``self``.

        Raises:
            ScriptedLLMStateError: it was already started (a ScriptedLLM starts once), or the
                serving thread did not come up within ``start_timeout``.
            OSError: the address cannot be bound.
        """
        with self._lock:
            if self._started:
                raise ScriptedLLMStateError("this ScriptedLLM was already started; create a new one")
            self._httpd = LoopbackServer(self._address, Responder(self._book, self._clock))
            self._started = True
            self._owner_pid = os.getpid()
            # Daemon: if the test process exits without stop(), nothing is lost but the fake.
            self._thread = threading.Thread(target=self._serve, name=THREAD_NAME, daemon=True)
            self._thread.start()
        if not self._ready.wait(self._start_timeout):
            self.stop()
            raise ScriptedLLMStateError(f"the ScriptedLLM did not start within {self._start_timeout} s")
        _log.debug("scripted-llm listening on %s", self.base_url)
        return self

    def _serve(self) -> None:
        httpd = self._httpd
        assert httpd is not None
        self._ready.set()
        try:
            while not self._stop_event.is_set():
                httpd.handle_request()  # returns within httpd.timeout when idle
        except Exception as err:  # noqa: BLE001 - surfaced as an anomaly, never swallowed
            if not self._stop_event.is_set():
                message = f"scripted-llm: the serving thread died: {type(err).__name__}: {err}"
                _log.exception("%s", message)
                self._book.add_anomaly(Anomaly(kind="server_error", model="", message=message))

    def stop(self) -> None:
        """Stop serving and join the threads, within ``stop_timeout``. Idempotent; safe before start.

        In a forked child it closes only the child's copy of the listening socket: the
        serving thread is the parent's (and its locks may be held by threads the child lacks).
        """
        if self._forked():
            httpd, self._httpd, self._stopped = self._httpd, None, True
            if httpd is not None:
                httpd.socket.close()
            return
        with self._lock:
            if not self._started or self._stopped:
                self._stopped = True
                return
            self._stopped = True
            thread, httpd = self._thread, self._httpd
        deadline = self._clock.monotonic() + self._stop_timeout
        self._stop_event.set()
        if thread is not None:
            thread.join(max(0.0, deadline - self._clock.monotonic()))
            if thread.is_alive():
                _log.warning("scripted-llm: the serving thread did not stop within %s s", self._stop_timeout)
        if httpd is not None:
            httpd.server_close()
            left = httpd.join_requests(max(0.0, deadline - self._clock.monotonic()), self._clock.monotonic)
            if left:
                _log.warning("scripted-llm: %d request(s) still running after stop (a slow policy?)", left)

    def __enter__(self) -> ScriptedLLM:
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()

    @property
    def is_running(self) -> bool:
        """True between a successful ``start()`` and ``stop()``."""
        return self._started and not self._stopped and self._ready.is_set()

    # --- wiring ---------------------------------------------------------------------

    @property
    def port(self) -> int:
        """The port it listens on.

        Raises:
            ScriptedLLMStateError: it has not been started.
        """
        httpd = self._httpd
        if httpd is None:
            raise ScriptedLLMStateError("start() the ScriptedLLM before asking for its address")
        return int(httpd.server_address[1])

    @property
    def base_url(self) -> str:
        """``http://<host>:<port>/v1``: the OpenAI base URL to give the Conductor server."""
        return f"http://{self._address[0]}:{self.port}/v1"

    def server_env(self) -> dict[str, str]:
        """The environment a Conductor server process needs to use this fake as its OpenAI provider, and as
        its Anthropic one (``anthropic/<model>`` is answered by the script of ``<model>``, as ``openai/<model>``)."""
        return {"OPENAI_BASE_URL": self.base_url, "OPENAI_API_KEY": API_KEY,
                "ANTHROPIC_BASE_URL": f"http://{self._address[0]}:{self.port}", "ANTHROPIC_API_KEY": API_KEY}

    def _forked(self) -> bool:
        return self._owner_pid is not None and self._owner_pid != os.getpid()

    def _live_book(self) -> ScriptBook:
        """The script book, from the process that serves it only."""
        if self._forked():
            raise ScriptedLLMStateError(
                f"this ScriptedLLM serves from process {self._owner_pid}; this process ({os.getpid()}) is a "
                "fork of it, where its scripts and records are a copy the server never sees: script and "
                "inspect it in the process that started it (scripts registered before the fork work here)")
        return self._book

    # --- scripting ------------------------------------------------------------------

    def script(
        self,
        turns: Iterable[Any] | None = None,
        *,
        policy: Policy | None = None,
        model: str | None = None,
        replace: bool = False,
    ) -> str:
        """Register a script and return the model string to put in the agent (``"openai/<model>"``).

        ``turns`` are answered in order, one per request for this model (across every run
        using it). ``policy`` is called with each :class:`LLMRequest` once the turns are used
        up (or for every request when there are none); it runs with no lock held. With
        neither left, the fake answers a final text saying the script is exhausted and
        records an anomaly. ``model`` defaults to a fresh ``scripted-<8 hex>`` name.

        Raises:
            ScriptError: no turns and no policy, a malformed turn, a bad model name, or a
                model that already has a script (unless ``replace=True``).
        """
        return PROVIDER_PREFIX + self._live_book().register(turns, policy, model, replace)

    def fail_next(self, model: str, status: int = 500, count: int = 1, body: Any = None) -> None:
        """Answer the next ``count`` requests for ``model`` with HTTP ``status`` (before any turn).

        Raises:
            ScriptError: the model has no script, ``status`` is not 400-599, or ``count`` < 1.
        """
        self._live_book().fail_next(model, Failure(status=status, body=body), count)

    def remaining_turns(self, model: str) -> int:
        """How many scripted turns and pending failures are left for ``model``."""
        return self._live_book().remaining_turns(model)

    # --- inspecting -----------------------------------------------------------------

    @property
    def requests(self) -> tuple[LLMRequest, ...]:
        """A snapshot of every recorded request, oldest first."""
        return self._live_book().requests()

    def requests_for(self, model: str) -> tuple[LLMRequest, ...]:
        """A snapshot of the requests for ``model`` (``"openai/x"`` or ``"x"``), oldest first."""
        return self._live_book().requests(model)

    def wait_for_requests(self, model: str, n: int, timeout: float = 10.0) -> tuple[LLMRequest, ...]:
        """Wait until ``model`` has received at least ``n`` requests; returns them all.

        Failed (scripted-failure) requests count too.

        Raises:
            ScriptedLLMTimeoutError: fewer than ``n`` arrived within ``timeout`` seconds.
        """
        return self._live_book().wait_for_requests(model, n, timeout)

    @property
    def anomalies(self) -> tuple[Anomaly, ...]:
        """A snapshot of every anomaly recorded, oldest first."""
        return self._live_book().anomalies()

    def anomalies_for(self, model: str) -> tuple[Anomaly, ...]:
        """A snapshot of the anomalies for ``model``."""
        return self._live_book().anomalies(model)

    def exhausted(self, model: str) -> bool:
        """True once a request for ``model`` arrived after its turns ran out (and it has no policy)."""
        return self._live_book().exhausted(model)

    def assert_no_anomalies(self, model: str | None = None) -> None:
        """Fail the test if anything was answered off-script (for ``model``, or at all).

        Raises:
            AssertionError: listing every anomaly.
        """
        found = self._live_book().anomalies(model)
        if found:
            lines = "\n".join(f"- [{a.kind}] {a.message}" for a in found)
            raise AssertionError(f"ScriptedLLM answered {len(found)} request(s) off-script:\n{lines}")

    def __repr__(self) -> str:
        state = "running" if self.is_running else ("stopped" if self._stopped else "not started")
        where = f" {self.base_url}" if self._httpd is not None else ""
        return f"<ScriptedLLM {state}{where}>"
