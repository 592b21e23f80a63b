"""An idempotent tool: killed after its side effect, resumed, and the side effect still happens once.

Conductor delivers a tool call *at least once*. A worker killed after the tool did its work but
before the result reached the server runs the same call again once the run is resumed. The tool
below makes that harmless: it keys its write on ``ctx.idempotency_key``, which is the same on every
delivery of one call (``ctx.attempt`` tells the deliveries apart).

1. A child process (this file with ``--child``) starts the run and serves its tool. The tool writes
   the payment row to a SQLite file, then hangs, as if the process died right there.
2. The child is killed with SIGKILL after the row is committed and before any result is posted.
3. This process calls ``runtime.resume(execution_id, agent, force=True)`` (force: it killed the
   child itself). The task the dead worker held is handed back, and the call is delivered here
   with ``attempt == 2`` and the same key. The tool finds the row already there and returns it
   instead of writing a second one.
4. The run completes; the table holds exactly one row.

Run it offline (a real Conductor server on this machine, with a scripted model):

    python samples/idempotent_tool.py

Or against your own server and a real model:

    CONDUCTOR_SERVER_URL=http://localhost:8080/api \\
    CONDUCTOR_AGENT_MODEL=anthropic/claude-sonnet-4-6 python samples/idempotent_tool.py --remote
"""

from __future__ import annotations

import argparse
import os
import queue
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from typing import Optional

from conductor_agents import Agent, AgentRuntime, AgentSettings, ToolContext, ToolRegistry, tool

DEFAULT_MODEL = "anthropic/claude-sonnet-4-6"


class Payments:
    """Records payments in a SQLite file, once per tool call whatever the number of deliveries."""

    def __init__(self, db_path: str, *, hang_after_write: bool = False) -> None:
        self.db_path = db_path
        self.hang_after_write = hang_after_write  # the child's way of "dying" right after the side effect
        with self._connect() as db:
            db.execute("CREATE TABLE IF NOT EXISTS payments (idempotency_key TEXT PRIMARY KEY, order_id TEXT, "
                       "amount REAL, attempt INTEGER, pid INTEGER)")

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.db_path, timeout=30)

    @tool(stateful=True)
    def record_payment(self, order_id: str, amount: float, ctx: ToolContext) -> dict:
        """Record a payment for an order and return its receipt.

        Args:
            order_id: The order being paid.
            amount: The amount paid, in euros.
        """
        print(f"  [pid {os.getpid()}] record_payment attempt {ctx.attempt} key {ctx.idempotency_key}", flush=True)
        with self._connect() as db:  # one transaction: the row is written once per key, whoever comes first
            db.execute("INSERT OR IGNORE INTO payments VALUES (?, ?, ?, ?, ?)",
                       (ctx.idempotency_key, order_id, amount, ctx.attempt, os.getpid()))
            row = db.execute("SELECT order_id, amount, attempt, pid FROM payments WHERE idempotency_key = ?",
                             (ctx.idempotency_key,)).fetchone()
        print(f"  [pid {os.getpid()}] payment row: {row}", flush=True)
        if self.hang_after_write:
            print("SIDE EFFECT DONE", flush=True)
            threading.Event().wait(300)  # the parent SIGKILLs this process here: no result is ever posted
        return {"order_id": row[0], "amount": row[1], "receipt": ctx.idempotency_key,
                "already_recorded": row[2] != ctx.attempt}  # an earlier delivery wrote it

    def rows(self) -> "list[tuple]":
        with self._connect() as db:
            return db.execute("SELECT idempotency_key, order_id, amount, attempt, pid FROM payments").fetchall()


def build_agent(model: str, payments: Payments) -> Agent:
    return Agent(
        name="idempotent_payments",
        model=model,
        stateful=True,
        max_turns=5,
        tools=ToolRegistry.from_instance(payments),
        instructions="Record the payment the user asks for with record_payment, then confirm it in one sentence.",
    )


PROMPT = "Record a payment of 42.50 euros for order A-1."


# --- the child: starts the run and dies inside the tool ---------------------------------------------


def child(settings: AgentSettings, model: str, db_path: str) -> int:
    payments = Payments(db_path, hang_after_write=True)
    with AgentRuntime(settings) as runtime:
        handle = runtime.start(build_agent(model, payments), PROMPT)
        print(f"EXECUTION {handle.execution_id}", flush=True)
        handle.wait(timeout=300)  # never returns normally: the tool hangs until the parent kills us
    return 0


# --- the parent -------------------------------------------------------------------------------------


class ChildProcess:
    """This file with ``--child``, its stdout read line by line on a thread."""

    def __init__(self, settings: AgentSettings, model: str, db_path: str) -> None:
        env = {**os.environ, "CONDUCTOR_SERVER_URL": settings.server_url, "CONDUCTOR_AGENT_MODEL": model}
        self.process = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", "--db", db_path],
                                        env=env, stdout=subprocess.PIPE, text=True)
        self.lines: "queue.Queue[Optional[str]]" = queue.Queue()
        self._reader = threading.Thread(target=self._read, name="child-stdout", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def expect(self, prefix: str, timeout: float) -> str:
        """The child's next line starting with ``prefix`` (echoing the others)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(f"the child printed no {prefix!r} line within {timeout:g}s") from None
            if line is None:
                raise RuntimeError(f"the child exited ({self.process.wait()}) before printing {prefix!r}")
            print(line, flush=True)
            if line.lstrip().startswith(prefix):
                return line

    def kill(self) -> None:
        self.process.kill()  # SIGKILL: nothing in the child gets to clean up or post a result
        self.process.wait(timeout=30)
        self._reader.join(timeout=5)


def run_scenario(settings: AgentSettings, model: str, db_path: str) -> int:
    first = ChildProcess(settings, model, db_path)
    try:
        execution_id = first.expect("EXECUTION", timeout=120).split()[1]
        first.expect("SIDE EFFECT DONE", timeout=120)
        first.kill()
        print(f"killed child {first.process.pid} (SIGKILL) after its write, before its result was posted")

        payments = Payments(db_path)
        with AgentRuntime(settings) as runtime:
            # force=True: we killed the child ourselves; its last poll is seconds old, so without it
            # resume() would take the child for a live worker and refuse to take the run over.
            handle = runtime.resume(execution_id, build_agent(model, payments), force=True)
            print(f"resumed run {execution_id} in pid {os.getpid()}")
            result = handle.wait(timeout=120)
        rows = payments.rows()
        print(f"run ended {result.status.value}: {result.output}")
        print(f"payment rows: {len(rows)}")
        for row in rows:
            print(f"  {row}")
        return 0 if result.ok and len(rows) == 1 else 1
    finally:
        if first.process.poll() is None:
            first.kill()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--remote", action="store_true",
                        help="use CONDUCTOR_SERVER_URL and CONDUCTOR_AGENT_MODEL instead of a local server")
    parser.add_argument("--db", help="the SQLite file (default: a new temporary one)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    model = os.environ.get("CONDUCTOR_AGENT_MODEL", DEFAULT_MODEL)
    db_path = args.db or os.path.join(tempfile.mkdtemp(prefix="idempotent-tool-"), "payments.db")
    if args.child:
        return child(AgentSettings.from_env(), model, db_path)
    print(f"payments database: {db_path}")
    if args.remote:
        return run_scenario(AgentSettings.from_env(), model, db_path)

    from conductor_agents.testing import LocalStack, ToolCall

    print("starting a local Conductor server with a scripted model...")  # a first run also says it downloads the jar
    with LocalStack() as stack:
        model = stack.llm.script(policy=lambda request: "Payment recorded." if request.tool_outputs else
                                 ToolCall("record_payment", {"order_id": "A-1", "amount": 42.5}))
        print(f"server up at {stack.url}")
        return run_scenario(stack.settings, model, db_path)


if __name__ == "__main__":
    raise SystemExit(main())
