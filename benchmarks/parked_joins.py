"""Whether parked joins hold their park, and what 50 listeners waiting on a HUMAN task cost once they all do (issue 42).

    PYTHONPATH=. .venv/bin/python benchmarks/parked_joins.py --runs 50

One ``LocalServer`` and the scripted model; real agent runs whose wait tool is a ``human`` tool (see
``wait_shapes.py``). A warm-up (10 runs through a turn, then ended), a 30 s window of the server with no run (CPU per
thread group), then N runs waiting and the join of each parked once (``IN_PROGRESS``, ``callbackAfterSeconds``
3600); a 30 s window with every join's ``pollCount`` read before and after (how many parks did not hold); then each
join that moved parked again and read back, up to 5 rounds, until every park holds; a last 30 s window. Prints the
thread groups above 0.5 ms/s of each window. Nothing asserts.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import _jvm  # noqa: E402
import wait_shapes  # noqa: E402

from conductor_agents import Agent, AgentRuntime, AgentSettings  # noqa: E402
from conductor_agents.local_server import LocalServer  # noqa: E402
from conductor_agents.testing import ScriptedLLM, listener_policy  # noqa: E402

PARK = 3600


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=50)
    p.add_argument("--seconds", type=float, default=30.0)
    args = p.parse_args(argv)
    llm = ScriptedLLM()
    llm.start()
    node = LocalServer(env={**llm.server_env(), "CONDUCTOR_SCRIPT_MAX_EXECUTION_SECONDS": "30"}, progress=False)
    node.start()
    try:
        pid = node.pid
        assert pid is not None
        server = wait_shapes.Server(node.url)
        settings = AgentSettings.from_env(environ={}, server_url=node.url, continuation_enabled=False)

        def groups() -> dict[str, float]:
            g0, t0 = _jvm.thread_cpu(pid), time.monotonic()
            time.sleep(args.seconds)
            wall = time.monotonic() - t0
            return {k: round(v / wall * 1000, 1) for k, v in _jvm.delta(g0, _jvm.thread_cpu(pid)).items()
                    if v / wall * 1000 >= 0.5}

        def join_of(eid: str) -> dict:
            found = server.wait_and_join(eid, "HUMAN")
            assert found is not None, eid
            return found[1]

        model = llm.script(policy=listener_policy(lambda payload: None))
        with AgentRuntime(settings) as runtime:
            warm = wait_shapes._start_waiting(runtime, Agent("parked_warm", model, tools=[wait_shapes._human_wait()],
                                                             max_turns=1000), server, "human_parked", 10)
        for eid in warm:
            server.http.delete(f"{server.url}/workflow/{eid}", params={"reason": "warm-up"}, timeout=30)
        time.sleep(20)
        print("no run:", groups(), flush=True)
        with AgentRuntime(settings) as runtime:
            ids = wait_shapes._start_waiting(runtime, Agent("parked_joins", model, tools=[wait_shapes._human_wait()],
                                                            max_turns=1000), server, "human_parked", args.runs)
        for eid in ids:
            server.update(join_of(eid), "IN_PROGRESS", callback=PARK)
        time.sleep(30)
        before = {eid: join_of(eid)["pollCount"] for eid in ids}
        window = groups()
        moved = {eid: join_of(eid)["pollCount"] - before[eid] for eid in ids}
        escaped = [eid for eid, n in moved.items() if n]
        print(f"parked once: {window}; joins evaluated in the window: {len(escaped)} of {len(ids)} "
              f"({sorted(moved[e] for e in escaped)} evaluations)", flush=True)
        for round_ in range(5):
            for eid in escaped:
                server.update(join_of(eid), "IN_PROGRESS", callback=PARK)
            time.sleep(2)
            escaped = [eid for eid in escaped if join_of(eid)["callbackAfterSeconds"] < PARK // 2]
            if not escaped:
                print(f"every park holds after {round_ + 1} round(s) of re-parking", flush=True)
                break
        before = {eid: join_of(eid)["pollCount"] for eid in ids}
        window = groups()
        evaluated = sum(1 for eid in ids if join_of(eid)["pollCount"] != before[eid])
        print(f"every park read back: {window}; joins evaluated in the window: {evaluated} of {len(ids)}", flush=True)
        for eid in ids:
            server.http.delete(f"{server.url}/workflow/{eid}", params={"reason": "parked_joins done"}, timeout=30)
    finally:
        node.stop()
        llm.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
