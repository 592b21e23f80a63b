"""Unit tests for the boot archive: made once per jar and Java version, under a lock, never half; else the jar.

A stand-in ``java`` (a small Python script) plays both parts: ``-Djarmode=tools ... extract``
writes the unpacked jar, and the training start writes the archive it is asked for. It
records each call in a file, so the tests can count how often each part ran.
"""

from __future__ import annotations

import stat
import sys
import textwrap
import threading
import zipfile
from pathlib import Path
from typing import List

import pytest

from conductor_agents.errors import ConfigurationError
from conductor_agents.local_server import _boot_archive, _proc
from conductor_agents.local_server._boot_archive import (
    BOOT_ARCHIVE_ENV,
    BootLaunch,
    boot_archive_enabled,
    discard,
    discard_unpacked,
    is_archivable_jar,
    prepare_launch,
    rejected_archive,
)
from conductor_agents.local_server._command import training_command
from conductor_agents.local_server._java import JavaRuntime

FAKE_JAVA = textwrap.dedent(
    """\
    #!{python}
    import os, sys, time
    args = sys.argv[1:]
    with open(os.environ["FAKE_JAVA_CALLS"], "a") as calls:
        calls.write(("extract" if "-Djarmode=tools" in args else "train") + "\\n")
    time.sleep(float(os.environ.get("FAKE_JAVA_SLEEP", "0")))
    if os.environ.get("FAKE_JAVA_FAIL"):
        sys.exit(3)
    if "-Djarmode=tools" in args:
        destination = args[args.index("--destination") + 1]
        os.makedirs(destination)
        jar = args[args.index("-jar") + 1]
        with open(os.path.join(destination, os.path.basename(jar)), "w") as out:
            out.write("thin jar")
        sys.exit(0)
    for arg in args:
        if arg.startswith(("-XX:AOTCacheOutput=", "-XX:ArchiveClassesAtExit=")):
            with open(arg.split("=", 1)[1], "w") as out:
                out.write("archive")
    """
)


@pytest.fixture
def fake_java(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "bin" / "java"
    path.parent.mkdir()
    path.write_text(FAKE_JAVA.format(python=sys.executable))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("FAKE_JAVA_CALLS", str(tmp_path / "calls"))
    monkeypatch.setattr(_proc, "free_port", lambda: 1)  # the training start never listens here
    _boot_archive._failed.clear()
    return path


@pytest.fixture
def boot_jar(tmp_path: Path) -> Path:
    """A jar shaped like the Conductor boot jar (manifest and jarmode tools), with no classes."""
    jar = tmp_path / "conductor-server-9.9.9-boot.jar"
    with zipfile.ZipFile(jar, "w") as archive:
        archive.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\nSpring-Boot-Version: 3.5.14\n")
        archive.writestr("BOOT-INF/lib/spring-boot-jarmode-tools-3.5.14.jar", b"")
    return jar


def calls(tmp_path: Path) -> List[str]:
    path = tmp_path / "calls"
    return path.read_text().split() if path.exists() else []


def prepare(fake_java: Path, jar: Path, cache: Path, version: str = "25.0.1") -> BootLaunch:
    return prepare_launch(jar, JavaRuntime(fake_java, version), training_command, cache_dir=cache,
                          timeout=60, progress=False)


def test_the_first_start_makes_the_archive_and_later_ones_reuse_it(fake_java, boot_jar, tmp_path):
    """Unpacked once, trained once; the launch runs the unpacked jar with the AOT cache (Java 25)."""
    launch = prepare(fake_java, boot_jar, tmp_path / "cache")
    assert launch.archive is not None and launch.archive.read_text() == "archive"
    assert launch.jar.name == boot_jar.name and launch.jar.read_text() == "thin jar"
    assert launch.jvm_options == (f"-XX:AOTCache={launch.archive}",)
    assert prepare(fake_java, boot_jar, tmp_path / "cache") == launch
    assert calls(tmp_path) == ["extract", "train"]
    leftovers = [p.name for p in launch.archive.parent.iterdir() if p.name.startswith(".")]
    assert leftovers == []  # no temporary directory or file stays behind


def test_java_21_gets_a_dynamic_cds_archive(fake_java, boot_jar, tmp_path):
    launch = prepare(fake_java, boot_jar, tmp_path / "cache", version="21.0.5")
    assert launch.archive is not None and launch.archive.suffix == ".jsa"
    assert launch.jvm_options == (f"-XX:SharedArchiveFile={launch.archive}",)


def test_each_java_version_has_its_own_archive_beside_one_unpacked_jar(fake_java, boot_jar, tmp_path):
    first = prepare(fake_java, boot_jar, tmp_path / "cache", version="25.0.1")
    second = prepare(fake_java, boot_jar, tmp_path / "cache", version="25.0.2")
    assert first.archive != second.archive and first.jar == second.jar
    assert calls(tmp_path) == ["extract", "train", "train"]


def test_concurrent_first_starts_make_it_once(fake_java, boot_jar, tmp_path, monkeypatch):
    """Four threads at once: one makes it under the lock, the others wait and use it."""
    monkeypatch.setenv("FAKE_JAVA_SLEEP", "0.3")
    launches: List[BootLaunch] = []
    threads = [threading.Thread(target=lambda: launches.append(prepare(fake_java, boot_jar, tmp_path / "c")))
               for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(launches) == 4 and len(set(launches)) == 1 and launches[0].archive is not None
    assert calls(tmp_path) == ["extract", "train"]


def test_a_failed_training_gives_the_plain_jar_and_is_not_retried_in_this_process(fake_java, boot_jar, tmp_path,
                                                                                   monkeypatch):
    monkeypatch.setenv("FAKE_JAVA_FAIL", "1")
    assert prepare(fake_java, boot_jar, tmp_path / "cache") == BootLaunch.plain(boot_jar)
    assert prepare(fake_java, boot_jar, tmp_path / "cache") == BootLaunch.plain(boot_jar)
    assert calls(tmp_path) == ["extract"]
    [root] = [p for p in (tmp_path / "cache" / "boot").iterdir() if p.is_dir()]
    assert sorted(p.name for p in root.iterdir()) == ["extract.log"]  # nothing half made


def test_jars_that_cannot_be_unpacked_and_old_javas_get_the_plain_jar(fake_java, tmp_path, boot_jar):
    other = tmp_path / "other.jar"
    with zipfile.ZipFile(other, "w") as archive:
        archive.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\n")
    not_a_zip = tmp_path / "x.jar"
    not_a_zip.write_text("no")
    assert not is_archivable_jar(other) and not is_archivable_jar(not_a_zip) and is_archivable_jar(boot_jar)
    assert prepare(fake_java, other, tmp_path / "cache") == BootLaunch.plain(other)
    assert prepare(fake_java, boot_jar, tmp_path / "cache", version="17.0.9") == BootLaunch.plain(boot_jar)
    assert calls(tmp_path) == []


def test_discarding_removes_the_archive_and_then_the_unpacked_jar(fake_java, boot_jar, tmp_path):
    launch = prepare(fake_java, boot_jar, tmp_path / "cache")
    discard(launch)
    assert launch.archive is not None and not launch.archive.exists() and launch.jar.exists()
    discard_unpacked(prepare(fake_java, boot_jar, tmp_path / "cache"))
    assert not launch.archive.exists() and not launch.jar.exists()
    assert calls(tmp_path) == ["extract", "train", "train"]
    discard(BootLaunch.plain(boot_jar))  # a plain launch has nothing to discard
    assert boot_jar.exists()


def test_the_jvm_saying_it_ignored_the_archive_is_recognised():
    assert rejected_archive("[0.027s][error  ][aot] An error has occurred while processing the AOT cache.")
    assert rejected_archive("[0.001s][error  ][cds] Not a valid shared archive file (x.jsa)")
    assert not rejected_archive("[83.9s][warning][cds] Skipping jdk/proxy2/$Proxy77: Unsupported location")


@pytest.mark.parametrize("value, enabled", [("", True), ("1", True), ("on", True), ("0", False), ("false", False)])
def test_the_environment_variable_turns_it_off(value, enabled):
    assert boot_archive_enabled({BOOT_ARCHIVE_ENV: value}) is enabled


def test_a_bad_value_names_the_variable():
    with pytest.raises(ConfigurationError) as caught:
        boot_archive_enabled({BOOT_ARCHIVE_ENV: "maybe"})
    assert caught.value.variable == BOOT_ARCHIVE_ENV
