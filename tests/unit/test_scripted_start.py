"""``server start --scripted-model`` starts the scripted model and waits until it says where it listens, or
refuses as soon as the process ends (cli/_scripted.py, through local_server's one ``wait_ready``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conductor_agents.cli import _scripted
from conductor_agents.errors import LocalServerError

WRITES_READY = """
import json, sys, time
path = sys.argv[sys.argv.index("--ready-file") + 1]
with open(path + ".tmp", "w") as out:
    json.dump({"model": "openai/scripted", "server_env": {"OPENAI_API_KEY": "k"}}, out)
import os; os.replace(path + ".tmp", path)
time.sleep(60)
"""


def spawning(code: str, monkeypatch: pytest.MonkeyPatch) -> None:
    real = _scripted._proc.spawn

    def spawn(cmd: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        return real([sys.executable, "-c", code, *cmd[3:]], **kwargs)

    monkeypatch.setattr(_scripted._proc, "spawn", spawn)


def test_the_scripted_model_is_ready_once_its_ready_file_says_where_it_listens(tmp_path: Path,
                                                                                monkeypatch: pytest.MonkeyPatch):
    spawning(WRITES_READY, monkeypatch)
    model = _scripted.start_scripted_model(tmp_path, detached=False)
    try:
        assert ("openai/scripted", {"OPENAI_API_KEY": "k"}) == (model.model, model.server_env)
        assert _scripted._proc.is_alive(model.pid)
    finally:
        model.stop()
    assert not _scripted._proc.is_alive(model.pid)


def test_a_scripted_model_that_exits_before_it_is_ready_is_refused_at_once(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch):
    spawning("import sys; sys.exit(3)", monkeypatch)
    with pytest.raises(LocalServerError, match="the scripted model did not start .log: .*scripted-model.log"):
        _scripted.start_scripted_model(tmp_path, detached=False)
