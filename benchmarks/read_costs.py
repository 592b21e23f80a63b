"""Bytes per read of a long run: the SDK's reads before and after issue 18, on one long run (100 turns by default).

    .venv/bin/python benchmarks/read_costs.py [--turns 100]

Starts a local server and a stateful agent whose model calls a tool every turn (no message digest, so
the run can reach 500 turns without continuation); at the last turn the tool blocks, so the run is
RUNNING while each read is taken. Each read is measured as the body bytes the server sends for it:

- before: liveness sample, delivery check, events poll and resume each read the whole task list
  (``GET /workflow/{id}?includeTasks=true``);
- after: liveness = status + SCHEDULED tasks; delivery = status with variables + unfinished tasks;
  events poll = status + the task pages from the first unfinished one (the second and later polls);
  resume = the run without tasks + its IN_PROGRESS tasks.
Prints the table (and writes ``benchmarks/results-read-costs.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading

import requests

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from conductor_agents import Agent, AgentRuntime, AgentSettings, LocalServer, tool  # noqa: E402
from conductor_agents._events.polling import TaskEvents  # noqa: E402
from conductor_agents.testing import ScriptedLLM, ToolCall  # noqa: E402


def main(argv: "list[str]") -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--turns", type=int, default=100)
    args = p.parse_args(argv)
    release = threading.Event()

    @tool
    def step(n: int = 0) -> dict:
        """One step."""
        if n >= args.turns - 1:
            release.wait(300)  # the last one holds the run RUNNING while it is measured
        return {"n": n}

    with tempfile.TemporaryDirectory() as tmp, ScriptedLLM() as llm:
        server = LocalServer(tmp, env=llm.server_env(), startup_timeout=600)
        server.start()
        try:
            model = llm.script(policy=lambda r: ToolCall("step", {"n": r.turn_index}) if r.turn_index < args.turns
                               else "done")
            agent = Agent(name="read_costs", model=model, stateful=True, max_turns=args.turns + 5, tools=[step],
                          instructions="Step.")
            with AgentRuntime(AgentSettings.from_env(environ={}, server_url=server.url)) as runtime:
                handle = runtime.start(agent, "Go.")
                url, eid = server.url, handle.execution_id
                while len([t for t in requests.get(f"{url}/workflow/{eid}/tasks", params={"status": "IN_PROGRESS",
                                                                                             "count": 100}).json()
                           ["results"] if t.get("taskType") == "step" and (t.get("inputData") or {}).get("n") ==
                           args.turns - 1]) == 0:
                    release.wait(1.0)
                rows = measure(url, eid, runtime)
                release.set()
                handle.wait(timeout=120)
        finally:
            server.stop()
    print(f"{'read':<16}{'before (bytes)':>16}{'after (bytes)':>16}{'ratio':>10}")
    for name, before, after in rows:
        print(f"{name:<16}{before:>16,}{after:>16,}{after / before:>10.4f}")
    with open(os.path.join(HERE, "results-read-costs.json"), "w") as fh:
        json.dump({"turns": args.turns, "rows": [dict(read=n, before=b, after=a) for n, b, a in rows]}, fh, indent=1)
    return 0


def measure(url: str, eid: str, runtime: AgentRuntime) -> "list[tuple[str, int, int]]":
    def size(path: str, **params: object) -> int:
        return len(requests.get(f"{url}{path}", params=params or None, timeout=60).content)

    whole = size(f"/workflow/{eid}", includeTasks="true")
    status = size(f"/workflow/{eid}/status")
    with_vars = size(f"/workflow/{eid}/status", includeVariables="true")
    scheduled = size(f"/workflow/{eid}/tasks", status="SCHEDULED", count=100)
    unfinished = size(f"/workflow/{eid}/tasks", status="IN_PROGRESS", start=1, count=20)
    in_progress = size(f"/workflow/{eid}/tasks", status="IN_PROGRESS", start=0, count=200)
    no_tasks = size(f"/workflow/{eid}", includeTasks="false")

    counting = _CountingApi(runtime._api)
    reader = TaskEvents(counting, eid)
    reader.read()  # the first poll reads everything once
    counting.bytes = 0
    reader.read()
    return [("liveness", whole, status + scheduled), ("delivery check", whole, with_vars + unfinished),
            ("events poll", whole, counting.bytes), ("resume", whole, no_tasks + in_progress)]


class _CountingApi:
    """The API calls the events reader makes, with the bytes of their answers counted."""

    def __init__(self, api: object) -> None:
        self._api = api
        self.bytes = 0

    def workflow_status(self, execution_id: str, **kwargs: object) -> dict:
        answer = self._api.workflow_status(execution_id, **kwargs)
        self.bytes += len(json.dumps(answer, separators=(",", ":")))
        return answer

    def workflow_tasks(self, execution_id: str, **kwargs: object) -> object:
        page = self._api.workflow_tasks(execution_id, **kwargs)
        self.bytes += len(json.dumps({"totalHits": page.total, "results": page.tasks}, separators=(",", ":")))
        return page

    def agent_status(self, execution_id: str, **kwargs: object) -> dict:
        answer = self._api.agent_status(execution_id, **kwargs)
        self.bytes += len(json.dumps(answer, separators=(",", ":")))
        return answer


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
