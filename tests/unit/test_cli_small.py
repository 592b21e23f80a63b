"""The command line's small promises (issue 41, point 6): ``-V``, the verb list of docs/cli.md, the words of an
error, Ctrl-C while it starts."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from conductor_agents import __version__
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
