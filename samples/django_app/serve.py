"""Serve the Django listeners sample with gunicorn and several worker processes.

    pip install 'conductor-agents[samples]'
    python samples/django_app/serve.py                 # a local server + scripted model, 2 workers
    curl -X POST localhost:8000/listeners              # -> {"execution_id": ..., "pid": ...}
    curl -X POST localhost:8000/listeners/ID/messages -H 'content-type: application/json' \\
         -d '{"action": "generate-report", "topic": "sales"}'
    curl -X POST localhost:8000/listeners/ID/messages -H 'content-type: application/json' \\
         -d '{"action": "publish-report", "topic": "sales"}'   # waits for a person's approval
    open http://127.0.0.1:8000/approvals               # approve or reject it, from any worker
    curl -X POST localhost:8000/listeners/ID/stop      # the tool outputs name the pid that ran them

Against your own server and model (``--remote``), or without the sample runner at all:

    cd samples/django_app
    CONDUCTOR_SERVER_URL=... CONDUCTOR_AGENT_MODEL=... gunicorn --workers 4 --preload listeners_site.wsgi

``--preload`` builds the runtime once in the gunicorn master; each worker then uses it as its
own after the fork (docs/operations.md). Ctrl-C stops gunicorn, then the local server.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def gunicorn_command(port: int, workers: int, preload: bool) -> "list[str]":
    command = [sys.executable, "-m", "gunicorn", "--workers", str(workers), "--bind", f"127.0.0.1:{port}",
               "--chdir", str(HERE), "--timeout", "120", "listeners_site.wsgi:application"]
    return command + (["--preload"] if preload else [])


def serve(env: "dict[str, str]", args: argparse.Namespace) -> int:
    process = subprocess.Popen(gunicorn_command(args.port, args.workers, not args.no_preload), env=env)
    try:
        return process.wait()
    except KeyboardInterrupt:
        process.terminate()
        return process.wait(timeout=60)


def scripted_action(payload: object) -> object:
    """The offline model: a report for generate-report, a publication (needs approval) for publish-report."""
    from conductor_agents.testing import ToolCall

    if isinstance(payload, dict) and payload.get("action") == "generate-report":
        return ToolCall("generate_report", {"topic": payload.get("topic", "weekly")})
    if isinstance(payload, dict) and payload.get("action") == "publish-report":
        return ToolCall("publish_report", {"topic": payload.get("topic", "weekly")})
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--remote", action="store_true",
                        help="use CONDUCTOR_SERVER_URL and CONDUCTOR_AGENT_MODEL instead of a local server")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--no-preload", action="store_true", help="each worker imports the app itself")
    args = parser.parse_args()
    if args.remote:
        return serve(dict(os.environ), args)

    from conductor_agents.testing import LocalStack, listener_policy

    print("starting a local Conductor server with a scripted model...")  # a first run also says it downloads the jar
    with LocalStack() as stack:
        model = stack.llm.script(policy=listener_policy(scripted_action))
        return serve({**os.environ, "CONDUCTOR_SERVER_URL": stack.url, "CONDUCTOR_AGENT_MODEL": model}, args)


if __name__ == "__main__":
    raise SystemExit(main())
