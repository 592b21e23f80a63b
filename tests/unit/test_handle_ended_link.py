"""A listener that ended while a switch was under way: the switch is abandoned and its new run terminated; the
handle names the run the listener ended in, not the abandoned one (seen in a full run: ``current_execution_id``
pointed at the abandoned run, whose event stream holds one error)."""

from __future__ import annotations

from typing import Any

from conductor_agents import AgentSettings
from conductor_agents._listener.chain import ABANDONED_REASON
from conductor_agents._listener.chained_events import ChainedEvents
from conductor_agents._listener.directory import Chain, ChainDirectory
from conductor_agents._wire.api import ConductorApi
from conductor_agents._wire.transport import Transport
from conductor_agents.handle import AgentHandle
from tests.unit.fakes import BASE_URL, FakeClock, status_body
from tests.unit.test_events_unit import SEED_KINDS, FakeApi, seed_workflow

CHAIN = Chain("first-run", "0" * 32, "listener", 0)


def test_the_handle_names_the_run_a_listener_ended_in_after_an_abandoned_switch(http):
    ended, abandoned = CHAIN.link(0), CHAIN.link(1)
    http.add(http.GET, f"{BASE_URL}/agent/{abandoned.execution_id}/status",
             json=status_body(abandoned.execution_id, "TERMINATED",
                              reasonForIncompletion=f"{ABANDONED_REASON}: the previous run completed"))
    http.add(http.GET, f"{BASE_URL}/agent/{ended.execution_id}/status",
             json=status_body(ended.execution_id, "COMPLETED"))
    api = ConductorApi(Transport(BASE_URL))
    directory = ChainDirectory(api)
    directory.advance(CHAIN, abandoned)  # the switch started its run, then the listener ended
    handle = AgentHandle(chain=CHAIN, directory=directory, api=api, execution_id=CHAIN.execution_id,
                         agent_name="listener", run_id=CHAIN.run_id, settings=AgentSettings(server_url=BASE_URL),
                         clock=FakeClock())
    assert handle.current_execution_id == abandoned.execution_id  # as last learned, before any read

    status = handle.status()

    assert status.current_execution_id == ended.execution_id and status.runs == 1
    assert handle.current_execution_id == ended.execution_id and handle.runs == 1


class _ChainApi(FakeApi):
    """A listener's two runs by id: the first completed, the second an abandoned switch's (terminated, no task).
    Both have ended, so the reader reads their task lists."""

    def __init__(self, workflows: "dict[str, dict]") -> None:
        super().__init__([])
        self.workflows, self.read = workflows, []

    def _use(self, execution_id: str) -> None:
        self.workflow = self.workflows[execution_id]
        if not self.read or self.read[-1] != execution_id:
            self.read.append(execution_id)

    def agent_status(self, execution_id: str, *, timeout: Any = None) -> dict:
        self._use(execution_id)
        return {k: v for k, v in self.workflows[execution_id].items() if k in ("status", "reasonForIncompletion")}

    def workflow_status(self, execution_id: str, **kwargs: Any) -> Any:
        self._use(execution_id)
        return super().workflow_status(execution_id, **kwargs)

    def get_workflow(self, execution_id: str, **kwargs: Any) -> Any:
        self._use(execution_id)
        return super().get_workflow(execution_id, **kwargs)

    def workflow_tasks(self, execution_id: str, **kwargs: Any) -> Any:
        self._use(execution_id)
        return super().workflow_tasks(execution_id, **kwargs)


def test_events_read_from_an_abandoned_switchs_run_are_the_run_the_listener_ended_in():
    """A reader of a listener whose newest run (known to it) is an abandoned switch's gets the events of the run
    the listener ended in, not the abandoned run's one error: its history runs from its first run, which ended
    COMPLETED, and the abandoned run is never read."""
    ended, abandoned = CHAIN.link(0), CHAIN.link(1)
    api = _ChainApi({
        abandoned.execution_id: {"workflowId": abandoned.execution_id, "status": "TERMINATED", "tasks": [],
                                 "reasonForIncompletion": f"{ABANDONED_REASON}: the previous run completed"},
        ended.execution_id: seed_workflow()})
    directory = ChainDirectory(api)  # type: ignore[arg-type]
    directory.advance(CHAIN, abandoned)
    with ChainedEvents(api, directory, CHAIN, timeout=10, poll_interval=0.01) as events:
        got = [e.kind for e in events]
    assert got == SEED_KINDS
    assert api.read == [ended.execution_id]
