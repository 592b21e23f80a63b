"""Retention on a SQLite server with task indexing on (the server's default), where a full removal fails.

With one connection, the server's full removal (``DELETE /workflow/{id}/remove?archiveWorkflow=false``) nests a second
connection to delete the task index's rows: it holds the only one until Hikari's connection timeout (30 s on a stock
server, every other request stalled meanwhile), then fails. A process that met that failure archives from then on;
each new process (a deploy, a web server's recycled worker) paid the stall again until the failure was recorded on the
server. The test's server times the nested connection out after 2 s instead of 30 (the same failure, sooner).
"""

from __future__ import annotations

import attrs
import pytest
import requests

from conductor_agents import AgentRuntime, AgentSettings, LocalServer
from conductor_agents._listener.retention import FULL_REMOVAL_FAILED, Remover

pytestmark = pytest.mark.integration

_WORKFLOW = {"name": "stock_retention_probe", "version": 1, "schemaVersion": 2, "ownerEmail": "tests@localhost",
             "tasks": [{"name": "note", "taskReferenceName": "note", "type": "SET_VARIABLE",
                        "inputParameters": {"noted": True}}]}


def test_a_full_removal_that_failed_once_is_not_tried_again_by_a_new_process(tmp_path):
    properties = {"conductor.app.taskIndexingEnabled": "true", "spring.datasource.hikari.connection-timeout": "2000"}
    with LocalServer(tmp_path / "data", properties=properties) as server:
        assert requests.post(f"{server.url}/metadata/workflow", json=_WORKFLOW, timeout=30).ok
        runs = [requests.post(f"{server.url}/workflow/{_WORKFLOW['name']}", json={}, timeout=30).text
                for _ in range(8)]
        runtimes = [AgentRuntime(AgentSettings(server_url=server.url, auto_start_workers=False,
                                               liveness_enabled=False)) for _ in range(2)]
        try:
            first, later = (Spied(runtime._api) for runtime in runtimes)  # two processes' removers
            remover = Remover(first)
            # Whether a full removal meets the nested connection varies (3 in 5 first ones did): removed one by one
            # until one fails; that run is archived then.
            while not remover.archive and len({run for run, _ in first.removals}) < 6:
                assert remover.remove(runs[len({run for run, _ in first.removals})])
            assert remover.archive and first.removals[-2:] == [(first.removals[-1][0], False),
                                                               (first.removals[-1][0], True)]
            assert [row.get("domain") for row in runtimes[0]._api.poll_data(FULL_REMOVAL_FAILED)] == ["retention"]
            remover = Remover(later)
            assert remover.remove(runs[-2]) and remover.remove(runs[-1])
            assert later.removals == [(runs[-2], True), (runs[-1], True)]  # no full removal tried, no stall
        finally:
            for runtime in runtimes:
                runtime.close()
        removed = {run for run, _ in first.removals + later.removals}
        for run in removed:  # each is gone from the server
            assert requests.get(f"{server.url}/workflow/{run}", timeout=30).status_code == 404


@attrs.define
class Spied:
    """The real API, with the removals it was asked for recorded as (run, archive)."""

    api: object
    removals: list = attrs.field(factory=list)

    def remove_workflow(self, execution_id, *, archive, timeout=15.0):
        self.removals.append((execution_id, archive))
        return self.api.remove_workflow(execution_id, archive=archive, timeout=timeout)

    def __getattr__(self, name):
        return getattr(self.api, name)
