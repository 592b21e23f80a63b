"""The command line's small promises (issue 41, point 6): ``-V``, the verb list of docs/cli.md, the words of an
error, Ctrl-C while it starts."""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conductor_agents import __version__
from conductor_agents._common import early_interrupt
from conductor_agents._common.early_interrupt import launched_as_cli
from conductor_agents.cli import _main
from conductor_agents.cli._main import build_parser, main
from conductor_agents.cli._target import TargetError, load_agent

ROOT = Path(__file__).resolve().parents[2]


def test_dash_capital_v_prints_the_version_as_dash_dash_version_does(capsys) -> None:
    assert main(["--version"]) == 0
    long = capsys.readouterr().out
    assert main(["-V"]) == 0
    assert capsys.readouterr().out == long == f"conductor-agents {__version__}\n"


def parser_verbs() -> dict[str, set[str]]:
    """Every verb the parser knows, with the verbs under it (``server start``, ``schedule create``)."""
    def verbs_of(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
        actions = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
        return dict(actions[0].choices) if actions else {}

    return {name: set(verbs_of(verb)) for name, verb in verbs_of(build_parser()).items()}


def documented_verbs() -> dict[str, set[str]]:
    """The verbs docs/cli.md's opening list names: ``- **group**: `verb`, `verb sub|sub`: what they do``."""
    text = (ROOT / "docs" / "cli.md").read_text().split("\n## ", 1)[0]
    bullets = re.findall(r"^- \*\*\w+\*\*: (.+?)(?=^- |^$)", text, flags=re.M | re.S)
    assert bullets, "no verb list at the top of docs/cli.md"
    found: dict[str, set[str]] = {}
    for bullet in bullets:
        listed = bullet.split(": ", 1)[0]
        for name, under in re.findall(r"`([a-z]+)(?: ([a-z|]+))?`", listed):
            assert name not in found, f"{name} is listed twice"
            found[name] = set(under.split("|")) if under else set()
    return found


def test_docs_cli_lists_exactly_the_verbs_of_the_parser() -> None:
    """docs/cli.md missed nine verbs (issue 41, point 6): its list and the parser now hold the same verbs."""
    assert documented_verbs() == parser_verbs()
    assert {"serve", "pending", "list", "events", "schedule"} <= set(parser_verbs())


def test_a_target_that_is_not_an_agent_is_named_with_the_right_article(tmp_path: Path) -> None:
    """``MODULE:AGENT`` naming a number said "is a int" (issue 41, point 6)."""
    module = tmp_path / "not_agents.py"
    module.write_text("count = 42\nname = 'support'\nitems = [1]\n")
    said = {}
    for attr in ("count", "name", "items"):
        with pytest.raises(TargetError) as error:
            load_agent(f"{module}:{attr}")
        said[attr] = str(error.value)
    assert said == {attr: f"{module}:{attr} is {kind}, not an Agent or a function returning one"
                    for attr, kind in (("count", "an int"), ("name", "a str"), ("items", "a list"))}


#: A ``sitecustomize`` that sends this process SIGINT while the package is half imported (when its
#: ``runtime`` module is looked for): the moment a Ctrl-C in the first 0.3 s of ``run`` lands, every time.
INTERRUPT_WHILE_IMPORTING = '''
import os, signal, sys

# As a terminal launches it: Ctrl-C is Python's KeyboardInterrupt. A child inherits an ignored SIGINT, and a
# test process may have one (in a full run under xdist, CI saw this test's child ignore the SIGINT).
signal.signal(signal.SIGINT, signal.default_int_handler)

class InterruptOnce:
    def find_spec(self, name, path=None, target=None):
        if name == "conductor_agents.runtime":
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGINT)
        return None

sys.meta_path.insert(0, InterruptOnce())
'''
#: What pip writes as the ``conductor-agents`` console script.
CONSOLE_SCRIPT = '''import sys
from conductor_agents.cli import main
if __name__ == "__main__":
    sys.argv[0] = sys.argv[0].removesuffix(".exe")
    sys.exit(main())
'''


@pytest.mark.parametrize("launch", ["python -m", "console script"])
def test_ctrl_c_while_the_package_is_imported_is_exit_130_without_a_traceback(tmp_path: Path, launch: str) -> None:
    """Ctrl-C in the first 0.3 s of ``run`` printed a KeyboardInterrupt traceback (issue 41, point 6): it lands
    while the package is imported, before ``main`` catches it; the package holds it for the command line."""
    (tmp_path / "sitecustomize.py").write_text(INTERRUPT_WHILE_IMPORTING)
    script = tmp_path / "conductor-agents"
    script.write_text(CONSOLE_SCRIPT)
    command = ["-m", "conductor_agents"] if launch == "python -m" else [str(script)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, *command, "run", "agents.py:support", "Start."], capture_output=True,
                            text=True, timeout=60, cwd=tmp_path, env=env)
    assert (result.returncode, result.stderr, result.stdout) == (130, "\n", "")


#: A command line whose verb prints a line at once (as ``events`` does), its standard output a pipe nobody reads.
PRINTS_A_LINE = """
import argparse, sys
from conductor_agents.cli import _main
parser = argparse.ArgumentParser()
parser.set_defaults(verbose=0, handler=lambda args: print("an event", flush=True) or 0)
_main.build_parser = lambda: parser
sys.exit(_main.main([]))
"""


def test_a_reader_of_standard_output_that_went_away_is_exit_1_without_a_traceback() -> None:
    """``conductor-agents events ID | head -5`` ended in a BrokenPipeError traceback once ``head`` left."""
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line
    try:
        result = subprocess.run([sys.executable, "-c", PRINTS_A_LINE], stdout=write, stderr=subprocess.PIPE, text=True,
                                timeout=60, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                    [str(ROOT), os.environ.get("PYTHONPATH", "")])})
    finally:
        os.close(write)
    assert (result.returncode, result.stderr) == (1, "")


def test_ctrl_c_before_a_verb_runs_is_exit_130_without_a_traceback(monkeypatch, capsys) -> None:
    """A Ctrl-C while ``main`` builds its parser (it imports the verb groups) is caught as well."""
    def interrupted() -> argparse.ArgumentParser:
        raise KeyboardInterrupt

    monkeypatch.setattr(_main, "build_parser", interrupted)
    try:
        code: object = main(["status", "some-id"])
    except KeyboardInterrupt:
        code = "KeyboardInterrupt escaped"
    assert code == 130
    assert capsys.readouterr().err == "\n"


@pytest.mark.parametrize("argv0, orig_argv, cli", [
    ("/venv/bin/conductor-agents", ["/venv/bin/python", "/venv/bin/conductor-agents", "run"], True),
    ("C:\\venv\\Scripts\\conductor-agents.exe", ["python", "conductor-agents.exe"], True),
    ("-m", ["python", "-X", "importtime", "-m", "conductor_agents", "run"], True),
    ("-m", ["python", "-mconductor_agents", "run"], True),
    ("-m", ["python", "-m", "conductor_agents.local_server"], False),
    ("-m", ["python", "-m", "pytest"], False),
    ("/venv/bin/pytest", ["python", "/venv/bin/pytest"], False),
    ("-c", ["python", "-c", "import conductor_agents"], False),
    ("app.py", ["python", "app.py", "-m", "conductor_agents"], False),
])
def test_only_the_command_line_holds_ctrl_c(argv0: str, orig_argv: list[str], cli: bool) -> None:
    """A program that imports the package keeps Python's Ctrl-C; only ``conductor-agents`` and ``python -m
    conductor_agents`` exit 130 while it starts."""
    assert launched_as_cli(argv0, orig_argv) is cli


def test_importing_the_package_leaves_ctrl_c_as_it_was() -> None:
    """In this process (pytest, not the command line), Ctrl-C is still Python's KeyboardInterrupt."""
    assert signal.getsignal(signal.SIGINT) is not early_interrupt._exit_interrupted


def _snake_keys(value: object, path: str = "") -> list[str]:
    """Every key holding an underscore, at any depth, but under the user's own data."""
    found: list[str] = []
    if isinstance(value, dict):
        for key, inner in value.items():
            if "_" in str(key):
                found.append(f"{path}.{key}")
            if key not in ("arguments", "output", "context", "result"):
                found.extend(_snake_keys(inner, f"{path}.{key}"))
    elif isinstance(value, list):
        for inner in value:
            found.extend(_snake_keys(inner, path))
    return found


def test_every_json_the_cli_prints_is_camel_case() -> None:
    """``wait --json``'s tokenUsage said prompt_tokens beside executionId; ``schedule list --json`` said
    agent_name and next_run (issue 41, point 6: JSON mixed camelCase and snake_case)."""
    from datetime import datetime, timezone

    from conductor_agents import AgentResult, RunStatus, TokenUsage, ToolCallRecord
    from conductor_agents._scheduling.schedules import Schedule
    from conductor_agents.cli._agents import result_dict
    from conductor_agents.cli._schedules import _as_dict
    from conductor_agents.cli._watch import _event_dict
    from conductor_agents.events import ToolCallEvent

    result = AgentResult(execution_id="wf-1", status=RunStatus.COMPLETED, output="ok",
                         token_usage=TokenUsage(prompt_tokens=10, completion_tokens=5, total_tokens=15),
                         tool_calls=(ToolCallRecord(name="t", task_reference_name="t_1", status="COMPLETED",
                                                    arguments={"user_key": 1}, output={"user_out": 2}),))
    printed = result_dict(result)
    assert printed["tokenUsage"] == {"promptTokens": 10, "completionTokens": 5, "totalTokens": 15}
    assert _snake_keys(printed) == []  # the user's argument and output keys are theirs, left as they are
    schedule = Schedule(name="daily", agent_name="reports", cron="0 0 9 * * *", zone="UTC", paused=False,
                        prompt="go", context={"user_key": 1}, next_run=datetime(2026, 1, 1, tzinfo=timezone.utc))
    row = _as_dict(schedule)
    assert (row["agentName"], row["nextRun"], row["context"]) == ("reports", "2026-01-01T00:00:00+00:00",
                                                                   {"user_key": 1})
    assert _snake_keys(row) == []
    event = _event_dict(ToolCallEvent(execution_id="wf-1", id="e1", tool_name="t", arguments={"user_key": 1}))
    assert event["toolName"] == "t" and _snake_keys(event) == []


def test_list_of_a_module_agent_target_is_a_usage_error_naming_the_fix(capsys):
    """`list agents:listener` (a MODULE:AGENT where the agent's name goes) printed nothing and exited 0: no run has
    that name. It is refused before any request (issue 41's audit)."""
    assert main(["list", "agents:listener", "--server-url", "http://127.0.0.1:9/api"]) == 2
    err = capsys.readouterr().err
    assert "'agents:listener' is not an agent name" in err and "not a MODULE:AGENT target" in err


def test_an_agent_name_is_checked_as_agent_names_are():
    from conductor_agents._listener.running import agent_name_of
    from conductor_agents.errors import ConfigurationError

    assert agent_name_of("my_listener-2") == "my_listener-2"
    with pytest.raises(ConfigurationError, match="not an agent name"):
        agent_name_of("samples/listener.py")
