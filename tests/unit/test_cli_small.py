"""The command line's small promises (issue 41, point 6): ``-V``, the verb list of docs/cli.md, Ctrl-C while
it starts."""

from __future__ import annotations

from conductor_agents import __version__
from conductor_agents.cli._main import main


def test_dash_capital_v_prints_the_version_as_dash_dash_version_does(capsys) -> None:
    assert main(["--version"]) == 0
    long = capsys.readouterr().out
    assert main(["-V"]) == 0
    assert capsys.readouterr().out == long == f"conductor-agents {__version__}\n"
