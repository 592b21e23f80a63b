"""pause() and unpause() racing a switch (issue 44): a pause that read the listener just before its switch began
paused only the run the switch then ended, and the new run took turns, RUNNING right after pause() returned (seen
on the cluster with listeners continued every 3 turns). pause() now looks once more for a newer run, and a switch
whose old run is paused pauses its new run before ending the old one (``Switch.keep_paused``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from conductor_agents._listener.control import pause_listener, unpause_listener
from conductor_agents._listener.directory import Chain, Link
from conductor_agents._listener.switch import Switch
from conductor_agents._wire.api import TaskPage
from conductor_agents._wire.transport import HttpError

RUN_ID = "0" * 32
CHAIN = Chain("first-run", RUN_ID, "listener", 0)
OLD, NEW = CHAIN.link(0), CHAIN.link(1)


def _refused(path: str, status: int = 409) -> HttpError:
    return HttpError("refused", status=status, server_message="refused", method="PUT", path=path)


class Server:
    """Runs by id and their statuses, paused and resumed as the server does (409 for an ended run, an error for a
    resume of a run that is not paused); ``on_call`` runs before each request (a racing caller's move)."""

    def __init__(self, **statuses: str) -> None:
        self.statuses: dict[str, str] = {OLD.execution_id: "RUNNING", **statuses}
        self.on_call: Callable[[str], None] | None = None
        self.calls: list[str] = []

    def _call(self, what: str) -> None:
        self.calls.append(what)
        if self.on_call is not None:
            self.on_call(what)

    def workflow_status(self, execution_id: str, **_: Any) -> dict:
        self._call(f"status {execution_id}")
        return {"status": self.statuses[execution_id]}

    agent_status = workflow_status

    def workflow_tasks(self, execution_id: str, **_: Any) -> TaskPage:  # no model call under way
        return TaskPage(total=0, tasks=[])

    def pause_workflow(self, execution_id: str) -> None:
        self._call(f"pause {execution_id}")
        if self.statuses[execution_id] not in ("RUNNING", "PAUSED"):
            raise _refused(execution_id)
        self.statuses[execution_id] = "PAUSED"

    def resume_workflow(self, execution_id: str) -> None:
        self._call(f"resume {execution_id}")
        if self.statuses[execution_id] != "PAUSED":
            raise _refused(execution_id, 500)
        self.statuses[execution_id] = "RUNNING"


class Directory:
    """The links as the server has them: link 1 once it was started."""

    def __init__(self, server: Server) -> None:
        self.server = server

    def refresh(self, chain: Chain) -> Link:
        return NEW if NEW.execution_id in self.server.statuses else OLD

    newest = refresh


def switch(server: Server) -> Switch:
    return Switch(server, CHAIN, OLD, None, worker_id="w", pause=lambda seconds: False)  # type: ignore[arg-type]


def start_link_1(server: Server) -> None:
    server.statuses[NEW.execution_id] = "RUNNING"


def test_a_switch_keeps_the_listener_paused_when_the_pause_came_before_its_new_run():
    server = Server()
    started: list[bool] = []

    def race(call: str) -> None:  # the switch begins link 1 right after pause() looked for a newer run
        if call == f"pause {OLD.execution_id}" and not started:
            started.append(True)
            start_link_1(server)

    server.on_call = race
    directory = Directory(server)
    directory.refresh = lambda chain: OLD  # type: ignore[method-assign]  # both of pause()'s looks came before it
    pause_listener(server, directory, CHAIN, pause=lambda s: None)  # type: ignore[arg-type]
    assert server.statuses == {OLD.execution_id: "PAUSED", NEW.execution_id: "RUNNING"}

    switch(server).keep_paused()
    assert server.statuses[NEW.execution_id] == "PAUSED"


def test_pause_pauses_a_new_run_that_began_while_it_paused_the_old_one():
    server = Server()

    def race(call: str) -> None:
        if call == f"pause {OLD.execution_id}" and NEW.execution_id not in server.statuses:
            start_link_1(server)

    server.on_call = race
    pause_listener(server, Directory(server), CHAIN, pause=lambda s: None)  # type: ignore[arg-type]
    assert server.statuses == {OLD.execution_id: "PAUSED", NEW.execution_id: "PAUSED"}


def test_a_switch_leaves_its_new_run_alone_when_the_listener_is_not_paused():
    server = Server()
    start_link_1(server)
    switch(server).keep_paused()
    assert server.statuses[NEW.execution_id] == "RUNNING"
    assert not [call for call in server.calls if call.startswith(("pause", "resume"))]


def _paused_at_link_0_with_link_1_started() -> tuple[Server, Directory]:
    server = Server()
    server.statuses[OLD.execution_id] = "PAUSED"
    start_link_1(server)
    return server, Directory(server)


def test_an_unpause_that_ends_before_the_switch_pauses_its_new_run_is_seen_by_the_switch():
    server, directory = _paused_at_link_0_with_link_1_started()

    def race(call: str) -> None:  # the whole unpause() between the switch's look at link 0 and its pause of link 1
        if call == f"pause {NEW.execution_id}":
            server.on_call = None
            unpause_listener(server, directory, CHAIN)  # type: ignore[arg-type]

    server.on_call = race
    switch(server).keep_paused()
    assert set(server.statuses.values()) == {"RUNNING"}, server.statuses


def test_an_unpause_that_read_the_new_run_before_the_switch_paused_it_looks_again():
    server, directory = _paused_at_link_0_with_link_1_started()

    def race(call: str) -> None:  # the whole keep_paused() after unpause() read the runs, before it resumed link 0
        if call == f"resume {OLD.execution_id}":
            server.on_call = None
            switch(server).keep_paused()

    server.on_call = race
    unpause_listener(server, directory, CHAIN)  # type: ignore[arg-type]
    assert set(server.statuses.values()) == {"RUNNING"}, server.statuses
