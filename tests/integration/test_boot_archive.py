"""A real server still starts when its boot archive is broken, and the broken part is made again.

Each test gets a cache directory of its own holding the real unpacked jar (hard links to the
real cache's files, which are never written) and then breaks one part: the class archive
(garbage: the JVM ignores it and says so) or the unpacked jar (garbage: the JVM cannot start
from it, so the start is tried again from the boot jar).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import requests

from conductor_agents.local_server import LocalServer, find_java, resolve_server_jar
from conductor_agents.local_server._boot_archive import BootLaunch, prepare_launch
from conductor_agents.local_server._command import training_command

pytestmark = pytest.mark.integration


@pytest.fixture
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> "tuple[Path, BootLaunch]":
    """The jar, and the launch a cache of this test's own gives (a copy of the real boot archive)."""
    jar = resolve_server_jar(progress=False)
    real = prepare_launch(jar, find_java(), training_command, timeout=900, progress=False)
    assert real.archive is not None, "the boot archive could not be made on this machine"
    root = tmp_path / "cache" / "boot" / real.archive.parent.name
    root.mkdir(parents=True)
    shutil.copytree(real.archive.parent / "app", root / "app", copy_function=os.link)
    shutil.copyfile(real.archive, root / real.archive.name)
    monkeypatch.setenv("CONDUCTOR_AGENTS_CACHE_DIR", str(tmp_path / "cache"))
    copy = BootLaunch(root / "app" / jar.name, (), root / real.archive.name)
    return jar, copy


def healthy(server: LocalServer) -> bool:
    return requests.get(f"{server.base_url}/health", timeout=10).json().get("healthy") is True


def test_a_garbage_class_archive_is_ignored_and_deleted(own_cache, tmp_path):
    jar, launch = own_cache
    assert launch.archive is not None
    launch.archive.write_bytes(os.urandom(4096))
    server = LocalServer(tmp_path / "data", jar=jar, progress=False, startup_timeout=600)
    try:
        server.start()
        assert healthy(server)
        assert "An error has occurred while processing the AOT cache" in server.log_tail(10_000) or \
            "Not a valid shared archive file" in server.log_tail(10_000)
    finally:
        server.stop()
    assert not launch.archive.exists(), "the rejected archive is deleted (the next start makes it again)"
    assert launch.jar.is_file()


def test_a_broken_unpacked_jar_falls_back_to_the_boot_jar(own_cache, tmp_path):
    jar, launch = own_cache
    launch.jar.unlink()  # a hard link: unlink it first, so the real cache's file is never written
    launch.jar.write_bytes(b"not a jar")
    server = LocalServer(tmp_path / "data", jar=jar, progress=False, startup_timeout=600)
    try:
        server.start()
        assert healthy(server)
        assert f"-jar {jar}" in server.log_tail(10_000)  # the second launch ran the boot jar
    finally:
        server.stop()
    assert not launch.jar.exists() and launch.archive is not None and not launch.archive.exists()
