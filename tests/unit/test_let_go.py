"""A process whose presence lapsed lets go of its listeners, and serves them afresh when it adopts them again
(issue 44).

Seen in a soak: a server restart longer than ¾ of the stall made every serving process fence itself. Letting go went
through the path of a run that *ended*: each mailbox was looked at as if ended (*"its mailbox ended, and it could not
be retried…"*, the server being down), and a listener whose switch was under way stayed registered in the driver, its
job still stepping the switch, so serving it again kept the old registration (the mailbox not served again, new links
added to the poller that had been let go of)."""

from __future__ import annotations

import threading
import time

from conductor_agents import Agent
from conductor_agents._listener.directory import Chain, Link
from conductor_agents._listener.driver import ContinuationDriver
from conductor_agents._listener.switch import LinkSpec
from conductor_agents.continuation import Continuation
from conductor_agents.errors import ServerUnavailableError

NAME, RUN = "fenced_listener", "d" * 32
MAILBOX = "0b7a5c1e-2f3d-4e5a-8b6c-7d8e9f0a1b2c"


class _Api:
    """Every request fails as with a server that is down, and is recorded."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __getattr__(self, name: str):
        def call(*args, **kwargs):
            self.calls.append(name)
            raise ServerUnavailableError(f"{name}: cannot reach the server")
        return call


class _Directory:
    def advance(self, chain, link):
        pass


def _serve(driver: ContinuationDriver, chain: Chain, spec: LinkSpec, link: Link, registered: list):
    return driver.serve(chain, spec, link, turns_before=0,
                        handle_link=lambda on, execution_id: registered.append((on, execution_id)))


def test_letting_go_forgets_the_listener_without_a_look_at_the_server_and_serving_it_again_starts_afresh():
    api = _Api()
    driver = ContinuationDriver(api, _Directory(), worker_id="w",  # type: ignore[arg-type]
                                locally_busy=lambda _: False)
    chain = Chain(MAILBOX, RUN, NAME, 0, mailbox=True)
    spec = LinkSpec(Agent(name=NAME, model="openai/x"), "go", Continuation(max_turns=4))
    link = chain.link(0)
    before: list = []
    try:
        _serve(driver, chain, spec, link, before)
        assert before == [(True, MAILBOX), (True, link.execution_id)]
        served = driver._by_run[RUN]
        served.switch = object()  # a switch under way: a run that *ends* keeps the listener registered
        threads_before = {t.name for t in threading.enumerate()}

        driver.let_go([link.execution_id, MAILBOX])

        assert driver.served_links() == [] and RUN not in driver._by_run
        assert served.stopping.is_set()  # its job stops between steps
        time.sleep(0.2)  # a mailbox check would run on a thread of its own
        assert api.calls == []
        assert not {t.name for t in threading.enumerate()} - threads_before

        again: list = []
        _serve(driver, chain, spec, link, again)  # adopted again: a new registration, the mailbox served too
        assert again == [(True, MAILBOX), (True, link.execution_id)]
        assert driver._by_run[RUN] is not served and not driver._by_run[RUN].stopping.is_set()
    finally:
        driver.close()
