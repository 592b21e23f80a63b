"""How soon a tool learns things: a ToolRetry's next delivery, a cancel, a graceful stop.

    .venv/bin/python benchmarks/tool_signals.py --repeat 3
    .venv/bin/python benchmarks/tool_signals.py --server-url http://127.0.0.1:8080/api --llm-port 8099

Without ``--server-url`` it starts a LocalStack (a local server wired to a ScriptedLLM); with it, the
server must send its OpenAI calls to a ScriptedLLM on ``--llm-port`` (see docs/testing.md). Prints,
per scenario, the seconds of each repetition:

  retry 1s           ToolRetry(after_seconds=1) raised → the next delivery's body starts
  cancel (remote)    another runtime cancels the run → ctx.cancelled is set here (the server tells us)
  cancel (local)     this process's handle cancels the run → ctx.cancelled is set
  stop (remote)      another runtime asks a graceful stop → ctx.stop_requested is set here
  stop (local)       this process's handle asks it → ctx.stop_requested is set

Used for the figures in docs/tools.md; not part of ``make bench``.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
import uuid
from typing import Callable, List, Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from conductor_agents import Agent, AgentRuntime, AgentSettings, ToolContext, ToolRetry, tool  # noqa: E402
from conductor_agents.testing import LocalStack, ScriptedLLM, ToolCall  # noqa: E402


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def once_then_done(name: str) -> Callable:
    return lambda request: "done" if request.tool_outputs else ToolCall(name)


def retry_delay(llm: ScriptedLLM, runtime: AgentRuntime) -> float:
    name, starts = unique("retry"), []

    @tool(name=name)
    def flaky(ctx: ToolContext) -> str:
        """Asks for one retry."""
        starts.append(time.monotonic())
        if ctx.attempt == 1:
            raise ToolRetry("once", after_seconds=1)
        return "ok"

    model = llm.script(policy=once_then_done(name))
    runtime.run(Agent(unique("bench_retry"), model, tools=[flaky], stateful=True), "Go.", timeout=120)
    return starts[1] - starts[0]


def signal_delay(llm: ScriptedLLM, runtime: AgentRuntime, other: AgentRuntime, *, kind: str,
                 remote: bool) -> Optional[float]:
    name, entered, seen = unique("long"), threading.Event(), []

    @tool(name=name)
    def long_tool(ctx: ToolContext) -> str:
        """Waits for the signal."""
        entered.set()
        (ctx.cancelled if kind == "cancel" else ctx.stop_requested).wait(60)
        seen.append(time.monotonic())
        return "x"

    model = llm.script(policy=once_then_done(name))
    handle = runtime.start(Agent(unique("bench_signal"), model, tools=[long_tool], stateful=True), "Go.")
    if not entered.wait(60):
        raise RuntimeError("the tool did not start within 60 s")
    target = other.attach(handle.execution_id) if remote else handle
    began = time.monotonic()
    target.cancel("benchmark") if kind == "cancel" else target.stop()
    deadline = began + 60
    while not seen and time.monotonic() < deadline:
        time.sleep(0.01)
    handle.wait(timeout=120)
    return seen[0] - began if seen else None


def run(llm: ScriptedLLM, settings: AgentSettings, repeat: int) -> None:
    with AgentRuntime(settings) as runtime, AgentRuntime(settings) as other:
        rows = {"retry 1s": lambda: retry_delay(llm, runtime)}
        for kind in ("cancel", "stop"):
            for remote in (True, False):
                label = f"{kind} ({'remote' if remote else 'local'})"
                rows[label] = (lambda k=kind, r=remote: signal_delay(llm, runtime, other, kind=k, remote=r))
        for label, measure in rows.items():
            figures: List[Optional[float]] = [measure() for _ in range(repeat)]
            shown = ", ".join("n/a" if f is None else f"{f:.2f}" for f in figures)
            print(f"{label:<16} {shown}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--server-url")
    parser.add_argument("--llm-port", type=int, default=0)
    args = parser.parse_args()
    if args.server_url:
        with ScriptedLLM(port=args.llm_port) as llm:
            run(llm, AgentSettings.from_env(environ={}, server_url=args.server_url), args.repeat)
        return 0
    with LocalStack() as stack:
        run(stack.llm, stack.settings, args.repeat)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
