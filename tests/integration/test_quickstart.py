"""docs/quickstart.md, run as a newcomer would (issue 34): every ```sh and ```python block of the page, in order,
through bash and the real CLI, with one server (``server start --scripted-model``) of the test's own.

The page is the script: its blocks are read from the file, so the page and the test cannot drift. What the
test changes, and only that: the server's port (8080 may be taken here), the execution id a newcomer
copies from terminal 1 (``EXECUTION_ID``), the directory ``my_listener.py`` is saved in; and it runs the
"terminal 1" block in the background. The CLI's state and data directories are the test's own, and the
server inherits the suite's script time limit (``RESTARTABLE_ENV``: the server's own 4 s runs out on
shared cores).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from ..conftest import RESTARTABLE_ENV
from ..helpers import eventually

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]
PAGE = REPO_ROOT / "docs" / "quickstart.md"
TERMINAL_1 = "# terminal 1"
BLOCK_TIMEOUT = 240  # a block that starts the server: a JVM start on a busy machine
LISTENER_FILE = "my_listener.py"


def page_blocks() -> List[Tuple[str, str]]:
    """The page's ```sh and ```python blocks, in order: ``(language, code)``."""
    return re.findall(r"```(sh|python)\n(.*?)```", PAGE.read_text(), flags=re.S)


def free_port() -> int:
    from conductor_agents.local_server._proc import free_port as free

    return free()


class Shell:
    """Runs the page's shell blocks one after the other, carrying the environment (exports, the venv's
    activation) from one to the next, as one terminal would."""

    def __init__(self, env: Dict[str, str], tmp: Path) -> None:
        self.env = env
        self.tmp = tmp
        self.outputs: List[subprocess.CompletedProcess] = []

    def run(self, code: str, cwd: Path) -> subprocess.CompletedProcess:
        env_file = self.tmp / "env.out"
        script = f"set -e\n{code}\nenv -0 > {env_file}\n"
        done = subprocess.run(["bash", "-c", script], cwd=cwd, env=self.env, capture_output=True, text=True,
                              timeout=BLOCK_TIMEOUT)
        assert done.returncode == 0, f"{code}\nexit {done.returncode}\n{done.stdout}\n{done.stderr}"
        self.env = dict(item.split("=", 1) for item in env_file.read_text().split("\0") if "=" in item)
        self.outputs.append(done)
        return done


def test_every_command_of_the_quickstart_runs(tmp_path: Path) -> None:
    """Install, a server with the scripted model, a listener from the shell (run/send/status/stop/wait) and
    from Python, server stop: each block exits 0 and says what the page says it says."""
    blocks = page_blocks()
    assert [lang for lang, _ in blocks].count("python") == 1 and len(blocks) >= 7
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONDUCTOR_")}
    env.update(CONDUCTOR_AGENTS_STATE_DIR=str(tmp_path / "state"), XDG_DATA_HOME=str(tmp_path / "data"),
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}", **RESTARTABLE_ENV)
    shell = Shell(env, tmp_path)
    terminal_1 = None
    try:
        for lang, code in blocks:
            code = code.replace("server start --scripted-model", f"server start --scripted-model --port {port}")
            code = code.replace("127.0.0.1:8080", f"127.0.0.1:{port}")
            if lang == "python":
                assert code.startswith(f"# {LISTENER_FILE}\n")
                (tmp_path / LISTENER_FILE).write_text(code)
            elif code.startswith(TERMINAL_1):
                terminal_1 = subprocess.Popen(["bash", "-c", code], cwd=REPO_ROOT, env=shell.env, text=True,
                                              stdout=subprocess.PIPE, stderr=open(tmp_path / "t1.err", "w"),
                                              start_new_session=True)
                eventually(lambda: "waiting for a message" in (tmp_path / "t1.err").read_text(), timeout=90,
                           interval=0.2, message=f"terminal 1 runs the listener: {(tmp_path / 't1.err').read_text()}")
                execution_id = re.search(r"execution (\S+)", (tmp_path / "t1.err").read_text()).group(1)
            elif "EXECUTION_ID" in code:
                ran = shell.run(code.replace("EXECUTION_ID", execution_id), cwd=REPO_ROOT)
                assert f"delivered: run {execution_id} read it" in ran.stderr
                assert re.search(r"^status +RUNNING", ran.stdout, flags=re.M), ran.stdout  # waiting again, or busy
                last = ran.stderr.strip().splitlines()[-1]
                assert last.startswith("COMPLETED (stopped) after ") and "3 tool calls" in last, ran.stderr
                out, _ = terminal_1.communicate(timeout=60)
                terminal_1_err = (tmp_path / "t1.err").read_text()
                assert terminal_1.returncode == 0, terminal_1_err
                assert "tool generate_report(topic=sales)" in terminal_1_err
                assert terminal_1_err.strip().splitlines()[-1] == last  # the run's own numbers, both ways
            elif LISTENER_FILE in code:
                ran = shell.run(code, cwd=tmp_path)
                assert ran.stdout.strip().splitlines()[-1] == "COMPLETED stop ['q3']", ran.stderr
            elif code.startswith("export "):
                printed = shell.outputs[-1].stdout.splitlines()
                assert [line for line in printed if line.startswith("export ")] == code.strip().splitlines()
                shell.run(code, cwd=REPO_ROOT)
            else:
                ran = shell.run(code, cwd=REPO_ROOT)
                if "samples/listener.py --remote" in code:
                    assert "reports generated in this process: ['/reports/weekly-1.pdf']" in ran.stdout, ran.stderr
                if "server stop" in code:
                    assert "Stopped the Conductor server" in ran.stdout and "1 more process)" in ran.stdout
        assert shell.env.get("CONDUCTOR_AGENT_MODEL") == "openai/scripted"
    finally:
        if terminal_1 is not None and terminal_1.poll() is None:
            os.killpg(terminal_1.pid, signal.SIGKILL)
            terminal_1.wait(10)
        if (tmp_path / "state" / "server.json").exists():  # the page's last block did not run: stop it here
            subprocess.run([sys.executable, "-m", "conductor_agents", "server", "stop"], env=shell.env,
                           capture_output=True, timeout=60)
