"""A worker process the crash/resume test kills: it starts or resumes a listener run and serves it.

Run as a script (``python crash_child.py --server-url URL --name N --model M --log FILE
(--start | --resume EXECUTION_ID)``). It prints one JSON line ``{"execution_id", "pid",
"worker_id"}`` once its workers poll the run's domain, then serves the run until it is
killed, its parent goes away (stdin reaches EOF) or ``--max-seconds`` pass.

:class:`FileActionTools` is also imported by the test itself (the final resume runs there).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading

import attrs

from conductor_agents import Agent, AgentRuntime, AgentSettings, Continuation, tool
from tests import helpers


class FileActionTools:
    """Writes every action it carries out to a shared file: one fsync'ed JSON line each.

    The file is the ground truth of "acted on exactly once": it survives the process that
    wrote it being SIGKILLed, because each line is on disk before the tool returns.
    """

    def __init__(self, log_path: str, *, hang_on: "str | None" = None) -> None:
        self.log_path = log_path
        self.hang_on = hang_on  # an action whose body never returns here (it is killed inside it)
        self.lock = threading.Lock()

    @tool
    def act(self, action: str, tag: str = "") -> dict:
        """Carry out an action requested by an external message."""
        line = json.dumps({"action": action, "tag": tag, "pid": os.getpid()}) + "\n"
        with self.lock:
            with open(self.log_path, "a", encoding="utf-8") as fh:
                fh.write(line)
                fh.flush()
                os.fsync(fh.fileno())
        if action == self.hang_on:
            threading.Event().wait(300)  # bounded; the test SIGKILLs this process long before
        return {"done": action, "pid": os.getpid()}


def listener(name: str, model: str, tools: object, *, continue_every: "int | None" = None,
             keep_runs: "int | None | str" = "default") -> Agent:
    """The listener agent, at most 5 messages per wait (fewer loop turns per cycle); continued every
    ``continue_every`` turns when given, keeping ``keep_runs`` ended runs (None: all)."""
    keep = {} if keep_runs == "default" else {"keep_runs": keep_runs}
    continuation = Continuation(max_turns=continue_every, **keep) if continue_every else None
    return helpers.listener(name, model, tools, batch_size=5, continuation=continuation)


#: The steps of a switch (``conductor_agents._listener.switch.Switch``) after which ``--crash-at`` kills the process.
CRASH_STEPS = {"started": "start_new", "terminated": "terminate_old", "committed": "commit"}


def crash_after(step: str) -> None:
    """SIGKILL this process as soon as the first switch has done ``step`` (a test of crashes mid-switch)."""
    from conductor_agents._listener import switch as _switch

    name = CRASH_STEPS[step]
    original = getattr(_switch.Switch, name)

    def then_die(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        sys.stderr.write(f"crash_child: killed after the switch step {step}\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)
        return result

    setattr(_switch.Switch, name, then_die)


def crash_while_retiring(after: int) -> None:
    """SIGKILL this process right after its ``after``-th run removal (a test of crashes mid-sweep)."""
    from conductor_agents._listener import retention as _retention

    original = _retention.Remover.remove
    done = []

    def remove_then_die(self, execution_id):
        result = original(self, execution_id)
        done.append(execution_id)
        if len(done) >= after:
            sys.stderr.write(f"crash_child: killed after removing {len(done)} runs\n")
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        return result

    _retention.Remover.remove = remove_then_die


def crash_in_forward() -> None:
    """SIGKILL this process inside the mailbox's forward: right after it pushed a message whose action is
    ``crash-after-push``, or right before it pushes one whose action is ``crash-before-push`` (its mark is
    written by then). Pushed either way the forward does it: sent on into the listener's run (a listener that
    waits with ``pull``), or handed to its ``HUMAN`` wait by completing it (``human``: the batch completed holds
    the message)."""
    from conductor_agents._listener import mailbox as _mailbox

    def crashing(original, actions_of):
        def push_or_die(*args, **kwargs):
            actions = actions_of(*args, **kwargs)
            if "crash-before-push" in actions:
                _die("before pushing")
            result = original(*args, **kwargs)
            if "crash-after-push" in actions:
                _die("after pushing")
            return result
        return push_or_die

    def sent(api, directory, execution_id, body, **kwargs):
        return [str((body or {}).get("action") or "")]

    def handed(api, execution_id, wait, messages, **kwargs):
        return [str((m.get("payload") or {}).get("action") or "") for m in messages]

    _mailbox.send_to_listener = crashing(_mailbox.send_to_listener, sent)
    _mailbox.complete_wait = crashing(_mailbox.complete_wait, handed)


def _die(where: str) -> None:
    sys.stderr.write(f"crash_child: killed in the forward {where}\n")
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def read_actions(log_path: str) -> "list[dict]":
    """Every action line written so far."""
    try:
        with open(log_path, encoding="utf-8") as fh:
            return [json.loads(line) for line in fh if line.strip()]
    except FileNotFoundError:
        return []


def serve(agent: Agent, settings: AgentSettings, starts: int, parent_gone: threading.Event,
          max_seconds: float) -> int:
    """Serve the agent (and adopt its orphans) until SIGTERM, the parent going away or ``max_seconds``."""
    signal.signal(signal.SIGTERM, lambda *_: parent_gone.set())
    adopted: list = []
    with AgentRuntime(settings) as runtime:
        runtime.serve(agent, on_adopt=lambda handle: adopted.append(handle.execution_id))
        started = [runtime.start(agent, "Start listening.").execution_id for _ in range(starts)]
        print(json.dumps({"execution_ids": started, "pid": os.getpid(), "worker_id": runtime.worker_id}),
              flush=True)
        parent_gone.wait(max_seconds)
    sys.stderr.write(f"crash_child: closed after adopting {len(adopted)} runs\n")
    return 0


def main(argv: "list[str]") -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--server-url", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--max-seconds", type=float, default=300.0)
    parser.add_argument("--hang-on", default=None)
    parser.add_argument("--continue-every", type=int, default=None)
    parser.add_argument("--crash-at", choices=sorted(CRASH_STEPS), default=None)
    parser.add_argument("--keep-runs", default="default", help="a number, or 'all'")
    parser.add_argument("--crash-after-removals", type=int, default=None)
    parser.add_argument("--crash-in-forward", action="store_true")
    parser.add_argument("--listener-wait", choices=("pull", "human"), default=None)
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--start", action="store_true")
    group.add_argument("--resume")
    group.add_argument("--serve", action="store_true",
                       help="runtime.serve(agent), start --starts runs, adopt orphans; SIGTERM hands over")
    parser.add_argument("--starts", type=int, default=0)
    parser.add_argument("--stall-seconds", type=float, default=None)
    args = parser.parse_args(argv)
    # What the SDK did, with times, in the child's stderr file (the test quotes it when it fails).
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING,
                        format="%(asctime)s %(threadName)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("conductor_agents").setLevel(logging.INFO)

    parent_gone = threading.Event()

    def watch_stdin() -> None:
        sys.stdin.read()  # EOF when the parent closes the pipe or dies
        parent_gone.set()

    threading.Thread(target=watch_stdin, name="child-stdin", daemon=True).start()
    if args.crash_at:
        crash_after(args.crash_at)
    if args.crash_after_removals:
        crash_while_retiring(args.crash_after_removals)
    if args.crash_in_forward:
        crash_in_forward()
    keep = args.keep_runs if args.keep_runs == "default" else None if args.keep_runs == "all" else int(args.keep_runs)
    agent = listener(args.name, args.model, FileActionTools(args.log, hang_on=args.hang_on),
                     continue_every=args.continue_every, keep_runs=keep)
    settings = AgentSettings.from_env(environ={}, server_url=args.server_url)  # raw pushes signal the mailbox
    if args.listener_wait:
        settings = attrs.evolve(settings, listener_wait=args.listener_wait)
    if args.stall_seconds:
        settings = attrs.evolve(settings, liveness_stall_seconds=args.stall_seconds,
                                liveness_check_interval_seconds=1.0)
    if args.serve:
        return serve(agent, settings, args.starts, parent_gone, args.max_seconds)
    with AgentRuntime(settings) as runtime:
        if args.start:
            handle = runtime.start(agent, "Start listening.")
        else:
            handle = runtime.resume(args.resume, agent, force=True)  # the test killed the last server
        print(json.dumps({"execution_id": handle.execution_id, "pid": os.getpid(),
                          "worker_id": runtime.worker_id}), flush=True)
        parent_gone.wait(args.max_seconds)  # serve until killed (the point) or orphaned
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
