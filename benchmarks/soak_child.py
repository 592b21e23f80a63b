"""The soak's child processes (``benchmarks/soak.py``): a serving process, or an SDK sender.

    python benchmarks/soak_child.py serve '{"server_url": ..., "models": {...}, "journal": ..., ...}'
    python benchmarks/soak_child.py send  '{"server_url": ..., "targets": [...], "log": ..., ...}'

``serve``: ``runtime.serve()`` for every agent of the soak's population (adopting their runs), until
SIGTERM (a graceful hand-over, exit 0), stdin's EOF (the soak went away) or ``max_seconds``. Its recording
tools append one fsync'ed line per message acted on to ``journal``, so a SIGKILL loses nothing recorded.

``send``: sends messages with ``runtime.send_message`` to the ids the soak holds, one at a time, and
appends one fsync'ed line per attempt (accepted, refused by the server, or uncertain) to ``log``.
"""

from __future__ import annotations

import faulthandler
import json
import logging
import os
import random
import signal
import sys
import threading
import time
import uuid
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from conductor_agents import (  # noqa: E402
    Agent,
    AgentRuntime,
    AgentSettings,
    Continuation,
    ToolContext,
    ToolRegistry,
    WaitForMessageTool,
    tool,
)
from conductor_agents.errors import (  # noqa: E402
    ExecutionNotFoundError,
    ExecutionNotRunningError,
    MessageQueueFullError,
    RunPausedError,
)

#: The population's kinds: the agent each kind is, and its continuation (None: the defaults).
KINDS = ("plain", "cont", "gate", "pause")


class JsonLines:
    """Appends JSON lines to a file, each flushed and fsync'ed before :meth:`write` returns."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.lock = threading.Lock()

    def write(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, sort_keys=True) + "\n"
        with self.lock, open(self.path, "a", encoding="utf-8") as fh:
            fh.write(line)
            fh.flush()
            os.fsync(fh.fileno())


class Recorder:
    """The listeners' tools: each writes one journal line for the message it acts on."""

    def __init__(self, journal: JsonLines) -> None:
        self.journal = journal

    def _record(self, ctx: ToolContext, name: str, to: str, uid: str, sender: str, seq: int) -> dict[str, Any]:
        self.journal.write({"to": to, "uid": uid, "sender": sender, "seq": seq, "pid": os.getpid(),
                            "t": time.time(), "exec": ctx.execution_id, "run": ctx.run_id,
                            "key": ctx.idempotency_key, "attempt": ctx.attempt, "tool": name})
        return {"done": uid}

    @tool
    def record(self, ctx: ToolContext, to: str, uid: str, sender: str, seq: int) -> dict[str, Any]:
        """Act on a message: record it."""
        return self._record(ctx, "record", to, uid, sender, seq)

    @tool(approval_required=True)
    def record_gated(self, ctx: ToolContext, to: str, uid: str, sender: str, seq: int) -> dict[str, Any]:
        """Act on a message once a person approved it: record it."""
        return self._record(ctx, "record_gated", to, uid, sender, seq)


def agent_name(kind: str, tag: str) -> str:
    return f"soak_{kind}_{tag}"


def population(models: dict[str, str], tag: str, recorder: Recorder | None, continue_every: int) -> dict[str, Agent]:
    """The soak's agents by kind (the same definitions in the soak and in every serving process)."""
    tools = ToolRegistry.from_instance(recorder or Recorder(JsonLines(os.devnull)))
    agents = {}
    for kind in KINDS:
        continuation = Continuation(max_turns=continue_every) if kind == "cont" else None
        agents[kind] = Agent(
            name=agent_name(kind, tag), model=models[kind], stateful=True, max_turns=100_000,
            tools=[WaitForMessageTool.create(name="wait_for_message", batch_size=1), *tools],
            instructions="Loop: wait_for_message, act on it with the recording tool, repeat.",
            continuation=continuation)
    return agents


def settings_for(cfg: dict[str, Any], *, serving: bool) -> AgentSettings:
    settings = AgentSettings.from_env(environ={}, server_url=cfg["server_url"], http_timeout_seconds=60.0,
                                      auto_start_workers=serving)
    import attrs

    if cfg.get("stall_seconds"):
        settings = attrs.evolve(settings, liveness_stall_seconds=float(cfg["stall_seconds"]),
                                liveness_check_interval_seconds=1.0)
    if cfg.get("listener_wait"):
        settings = attrs.evolve(settings, listener_wait=str(cfg["listener_wait"]))
    return settings


def serve(cfg: dict[str, Any], done: threading.Event) -> int:
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    recorder = Recorder(JsonLines(cfg["journal"]))
    agents = population(cfg["models"], cfg["tag"], recorder, int(cfg["continue_every"]))
    adopted: list[str] = []
    with AgentRuntime(settings_for(cfg, serving=True)) as runtime:
        for agent in agents.values():
            runtime.serve(agent, on_adopt=lambda handle: adopted.append(handle.execution_id))
        print(json.dumps({"event": "serving", "pid": os.getpid(), "worker_id": runtime.worker_id}), flush=True)
        done.wait(float(cfg.get("max_seconds", 3600)))
    sys.stderr.write(f"soak_child: closed after adopting {len(adopted)} runs\n")
    return 0


#: Errors that say the server did not queue the message (it answered, and said no).
REFUSED = (RunPausedError, ExecutionNotRunningError, MessageQueueFullError, ExecutionNotFoundError)


def send(cfg: dict[str, Any], done: threading.Event) -> int:
    """Send to the targets in a seeded random order, one message every ``interval`` s, until told to stop."""
    log = JsonLines(cfg["log"])
    rng = random.Random(cfg["seed"])  # noqa: S311 - seeded, not a secret
    targets: list[str] = list(cfg["targets"])
    sender, interval = cfg["sender"], float(cfg["interval"])
    deadline = time.monotonic() + float(cfg["seconds"])
    with AgentRuntime(settings_for(cfg, serving=False)) as runtime:
        print(json.dumps({"event": "sending", "pid": os.getpid()}), flush=True)
        seq = 0
        while not done.is_set() and time.monotonic() < deadline:
            seq += 1
            to = rng.choice(targets)
            uid = uuid.uuid4().hex
            record: dict[str, Any] = {"uid": uid, "to": to, "sender": sender, "seq": seq, "t": time.time()}
            try:
                record["message_id"] = runtime.send_message(to, {"to": to, "uid": uid, "sender": sender, "seq": seq})
                record["outcome"] = "accepted"
            except REFUSED as err:
                record.update(outcome="refused", error=type(err).__name__)
            except Exception as err:  # noqa: BLE001 - no answer: it may be queued
                record.update(outcome="uncertain", error=f"{type(err).__name__}: {err}"[:300])
            record["t_done"] = time.time()
            log.write(record)
            done.wait(interval)
    return 0


def main(argv: list[str]) -> int:
    mode, cfg = argv[0], json.loads(argv[1])
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING,
                        format="%(asctime)s %(process)d %(threadName)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("conductor_agents").setLevel(logging.INFO)
    for name in filter(None, os.environ.get("SOAK_DEBUG_LOGGERS", "").split(",")):
        logging.getLogger(name).setLevel(logging.DEBUG)  # e.g. conductor_agents.serve
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1 PID`: every thread's stack in its log
    done = threading.Event()

    def watch_stdin() -> None:
        sys.stdin.read()  # EOF when the soak closes the pipe or dies
        done.set()

    threading.Thread(target=watch_stdin, name="soak-stdin", daemon=True).start()
    return serve(cfg, done) if mode == "serve" else send(cfg, done)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
