"""One table of exit codes, true everywhere: the code, ``--help``, README.md, docs/cli.md and the
``cli._main`` docstring all list exactly the codes of ``EXIT_CODE_TABLE`` (issue 34, point 6)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Set

import pytest

from conductor_agents.cli import _agents, _humans, _main, _options, _serve, _server
from conductor_agents.cli._main import EXIT_CODE_TABLE

ROOT = Path(__file__).resolve().parents[2]
CODES = {code for code, _ in EXIT_CODE_TABLE}


def help_text(*verb: str) -> str:
    result = subprocess.run([sys.executable, "-m", "conductor_agents", *verb, "--help"], capture_output=True,
                            text=True, timeout=60, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    return result.stdout


def help_codes(*verb: str) -> Set[int]:
    section = help_text(*verb).split("exit codes:", 1)[1]
    return {int(code) for code in re.findall(r"^  (\d+) ", section, flags=re.M)}


def test_every_exit_constant_is_in_the_table_and_every_code_has_one() -> None:
    constants = {value for module in (_main, _agents, _humans, _options, _serve, _server)
                 for name, value in vars(module).items() if re.fullmatch(r"_?EXIT_[A-Z_]+", name)
                 and isinstance(value, int)}
    assert constants == CODES
    assert sorted(CODES) == [code for code, _ in EXIT_CODE_TABLE]  # in order, no duplicates
    assert {0, 1, 2, 3, 4, 5, 6, 7, 130} <= CODES


def test_help_lists_every_code() -> None:
    assert help_codes() == CODES


@pytest.mark.parametrize("verb", [["run"], ["send"], ["wait"], ["pending"], ["approve"], ["serve"],
                                  ["schedule", "create"]])
def test_a_verbs_help_points_to_the_table_instead_of_repeating_it(verb) -> None:
    """The 20-line table is in the top-level ``--help`` only (issue 41, point 6)."""
    text = help_text(*verb)
    assert text.rstrip().endswith("exit codes: see conductor-agents --help")
    assert not re.search(r"^  130 ", text, flags=re.M)


def test_code_3_names_every_verb_that_exits_3_for_an_ended_run() -> None:
    """``signal`` on an ended run is exit 3 as ``send`` is (``ExecutionNotRunningError``), and the table says so."""
    meaning = dict(EXIT_CODE_TABLE)[3]
    for verb in ("send", "pause", "unpause", "signal", "approve", "reject", "respond"):
        assert verb in meaning


def test_docs_cli_table_is_the_table() -> None:
    text = (ROOT / "docs" / "cli.md").read_text().split("## Exit codes", 1)[1]
    rows = dict(re.findall(r"^\| (\d+) \| (.+) \|$", text, flags=re.M))
    assert {int(code) for code in rows} == CODES
    assert "`pending` also when nothing waits" in rows["0"]


def test_readme_and_docstring_list_the_same_codes() -> None:
    readme = (ROOT / "README.md").read_text()
    paragraph = readme.split("Exit codes: ", 1)[1].split("\n\n", 1)[0]
    assert {int(n) for n in re.findall(r"(?<![\w.#/-])(\d+) ", paragraph)} == CODES
    docstring = _main.__doc__.split("Exit codes", 1)[1]
    assert {int(n) for n in re.findall(r"(?<![\w.#/-])(\d+) ", docstring)} == CODES


def test_what_the_readme_says_docs_testing_documents_is_there() -> None:
    """The README names ScriptedLLM, LocalStack and the pytest plugin as documented in docs/testing.md (issue 34,
    point 10): each is there."""
    readme = (ROOT / "README.md").read_text()
    line = next(row for row in readme.splitlines() if row.startswith("- [docs/testing.md]"))
    testing = (ROOT / "docs" / "testing.md").read_text()
    assert {"ScriptedLLM", "LocalStack"} <= set(re.findall(r"`(\w+)`", line))
    assert "`ScriptedLLM`" in testing and "## pytest fixtures" in testing
    assert "### `LocalStack`" in testing and "with LocalStack() as stack:" in testing
