"""Finding the server jar: explicit path, cache, mvn, HTTPS fallback and their errors."""

from __future__ import annotations

import fcntl
import hashlib
import io
import stat
import zipfile
from pathlib import Path
from typing import List, Optional

import pytest
import responses

from conductor_agents.errors import ConfigurationError, JarDownloadError, LocalServerError
from conductor_agents.local_server import (
    DEFAULT_SERVER_VERSION,
    MAVEN_REPOSITORY_ENV,
    SERVER_JAR_ENV,
    SERVER_VERSION_ENV,
    resolve_server_jar,
    server_version,
)
from conductor_agents.local_server import _dirs, _maven

VERSION = "9.9.9"
JAR_NAME = f"conductor-server-{VERSION}-boot.jar"
REPO = "https://repo.example.test/maven2"
JAR_URL = f"{REPO}/org/conductoross/conductor-server/{VERSION}/{JAR_NAME}"


def make_jar(content: str = "hello") -> bytes:
    """Return the bytes of a small valid jar (zip) file."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\n")
        zf.writestr("payload.txt", content * 1000)
    return buf.getvalue()


def sha1(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()


def write_fake_mvn(bin_dir: Path, jar: bytes, *, digest: Optional[str] = None, fail: bool = False) -> Path:
    """Put a fake ``mvn`` on ``bin_dir`` that 'downloads' ``jar`` into the local repo and copies it out.

    It appends its arguments to ``bin_dir/mvn.args`` (one line per call).
    """
    bin_dir.mkdir(parents=True, exist_ok=True)
    source = bin_dir / "artifact.jar"
    source.write_bytes(jar)
    script = bin_dir / "mvn"
    body = f"""#!/bin/sh
echo "$@" >> "{bin_dir}/mvn.args"
{'echo "[ERROR] Could not find artifact"; exit 1' if fail else ''}
for a in "$@"; do
  case "$a" in
    -Dmaven.repo.local=*) REPO="${{a#-Dmaven.repo.local=}}";;
    -Dartifact=*) ART="${{a#-Dartifact=}}";;
    -DoutputDirectory=*) OUT="${{a#-DoutputDirectory=}}";;
  esac
done
V=$(echo "$ART" | cut -d: -f3)
D="$REPO/org/conductoross/conductor-server/$V"
mkdir -p "$D"
cp "{source}" "$D/conductor-server-$V-boot.jar"
printf '%s' "{digest or sha1(jar)}" > "$D/conductor-server-$V-boot.jar.sha1"
cp "$D/conductor-server-$V-boot.jar" "$OUT/"
echo "[INFO] BUILD SUCCESS"
"""
    script.write_text(body)
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return script


def mvn_calls(bin_dir: Path) -> List[List[str]]:
    path = bin_dir / "mvn.args"
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


def cache_files(cache: Path) -> List[str]:
    """Names in the cache other than lock files."""
    return sorted(p.name for p in cache.iterdir() if not p.name.endswith(".lock")) if cache.exists() else []


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "cache"


@pytest.fixture
def no_mvn_path(tmp_path: Path) -> str:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    return str(empty)


class TestVersionAndCache:
    def test_cache_hit_runs_nothing(self, cache: Path, tmp_path: Path) -> None:
        """A cached jar is returned without running mvn or making an HTTP request."""
        cache.mkdir()
        (cache / JAR_NAME).write_bytes(make_jar())
        bin_dir = tmp_path / "bin"
        write_fake_mvn(bin_dir, make_jar())
        env = {"PATH": str(bin_dir), MAVEN_REPOSITORY_ENV: REPO}
        with responses.RequestsMock(assert_all_requests_are_fired=False):  # any request would fail
            path = resolve_server_jar(VERSION, cache, environ=env, progress=False)
        assert path == cache / JAR_NAME
        assert mvn_calls(bin_dir) == []

    def test_version_precedence(self) -> None:
        """Argument, then CONDUCTOR_SERVER_VERSION, then the pinned default."""
        env = {SERVER_VERSION_ENV: "1.2.3"}
        assert server_version("4.5.6", env) == "4.5.6"
        assert server_version(None, env) == "1.2.3"
        assert server_version(None, {}) == DEFAULT_SERVER_VERSION == "3.32.3"

    def test_version_from_environment_picks_cached_file(self, cache: Path) -> None:
        """CONDUCTOR_SERVER_VERSION decides which cached jar is used."""
        cache.mkdir()
        (cache / "conductor-server-1.2.3-boot.jar").write_bytes(make_jar())
        path = resolve_server_jar(None, cache, environ={SERVER_VERSION_ENV: "1.2.3"}, progress=False)
        assert path.name == "conductor-server-1.2.3-boot.jar"

    def test_bad_version_is_rejected(self, cache: Path) -> None:
        """A version that is not a plain version string never becomes a path."""
        with pytest.raises(ConfigurationError) as info:
            resolve_server_jar("../../etc", cache, environ={}, progress=False)
        assert "../../etc" in str(info.value)
        with pytest.raises(ConfigurationError) as info:
            server_version(None, {SERVER_VERSION_ENV: "x y"})
        assert info.value.variable == SERVER_VERSION_ENV

    def test_explicit_jar_short_circuits(self, tmp_path: Path, cache: Path) -> None:
        """CONDUCTOR_SERVER_JAR is used as is, whatever the version and cache say."""
        jar = tmp_path / "my.jar"
        jar.write_bytes(make_jar())
        path = resolve_server_jar("1.0.0", cache, environ={SERVER_JAR_ENV: str(jar)}, progress=False)
        assert path == jar.resolve()
        assert not cache.exists()

    def test_explicit_jar_missing(self, tmp_path: Path) -> None:
        """A CONDUCTOR_SERVER_JAR that names no file is a configuration error naming the variable."""
        with pytest.raises(ConfigurationError) as info:
            resolve_server_jar(environ={SERVER_JAR_ENV: str(tmp_path / "nope.jar")}, progress=False)
        assert info.value.variable == SERVER_JAR_ENV

    def test_cache_dir_locations(self) -> None:
        """The cache honours CONDUCTOR_AGENTS_CACHE_DIR, then XDG_CACHE_HOME, then ~/.cache."""
        assert _dirs.cache_dir({"HOME": "/h"}) == Path("/h/.cache/conductor-agents")
        assert _dirs.cache_dir({"HOME": "/h", "XDG_CACHE_HOME": "/x"}) == Path("/x/conductor-agents")
        assert _dirs.cache_dir({"HOME": "/h", "XDG_CACHE_HOME": "/x", "CONDUCTOR_AGENTS_CACHE_DIR": "/c"}) == Path(
            "/c"
        )

    def test_cache_dir_from_environment(self, tmp_path: Path) -> None:
        """Without cache_dir the jar is looked up in CONDUCTOR_AGENTS_CACHE_DIR."""
        (tmp_path / JAR_NAME).write_bytes(make_jar())
        env = {"CONDUCTOR_AGENTS_CACHE_DIR": str(tmp_path)}
        assert resolve_server_jar(VERSION, environ=env, progress=False) == tmp_path / JAR_NAME


class TestMaven:
    def test_download_with_mvn(self, tmp_path: Path, cache: Path) -> None:
        """mvn fetches into its local repo; the verified copy is renamed into the cache."""
        jar = make_jar()
        bin_dir = tmp_path / "bin"
        write_fake_mvn(bin_dir, jar)
        m2 = tmp_path / "m2"
        path = resolve_server_jar(VERSION, cache, environ={"PATH": str(bin_dir)}, maven_repo=m2, progress=False)
        assert path == cache / JAR_NAME
        assert path.read_bytes() == jar
        assert cache_files(cache) == [JAR_NAME]  # no temporary leftovers
        (call,) = mvn_calls(bin_dir)
        assert "dependency:copy" in call
        assert f"-Dartifact=org.conductoross:conductor-server:{VERSION}:jar:boot" in call
        assert f"-Dmaven.repo.local={m2}" in call
        assert "-C" in call and "-B" in call

    def test_progress_is_one_line_and_maven_output_stays_in_its_log(
        self, tmp_path: Path, cache: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """With progress, stderr gets ONE line (what, where, size); Maven's own lines never reach it."""
        bin_dir = tmp_path / "bin"
        jar = make_jar()
        write_fake_mvn(bin_dir, jar)
        resolve_server_jar(VERSION, cache, environ={"PATH": str(bin_dir)}, maven_repo=tmp_path / "m2")
        captured = capsys.readouterr()
        assert captured.out == ""
        [line] = captured.err.splitlines()
        assert captured.err.endswith("\n")
        assert "BUILD SUCCESS" not in captured.err and "[INFO]" not in captured.err
        assert VERSION in line and str(cache) in line
        assert f"done: {len(jar) / (1024 * 1024):.1f} MB in " in line
        assert cache_files(cache) == [JAR_NAME]  # the Maven log of a success is not kept

    def test_failure_shows_one_line_then_the_log_tail_in_the_error(
        self, tmp_path: Path, cache: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """On failure the line ends with 'failed'; the error holds Maven's last lines and names its kept log."""
        bin_dir = tmp_path / "bin"
        write_fake_mvn(bin_dir, make_jar(), fail=True)
        with pytest.raises(JarDownloadError) as info:
            resolve_server_jar(VERSION, cache, environ={"PATH": str(bin_dir)}, maven_repo=tmp_path / "m2")
        [line] = capsys.readouterr().err.splitlines()
        assert line.endswith(" failed") and "[ERROR]" not in line
        log = cache / f"{JAR_NAME}.maven.log"
        assert "[ERROR] Could not find artifact" in log.read_text()
        assert str(log) in str(info.value) and "[ERROR] Could not find artifact" in str(info.value)

    def test_second_call_is_a_cache_hit(self, tmp_path: Path, cache: Path) -> None:
        """The second resolution does not run mvn again."""
        bin_dir = tmp_path / "bin"
        write_fake_mvn(bin_dir, make_jar())
        env = {"PATH": str(bin_dir)}
        for _ in range(2):
            resolve_server_jar(VERSION, cache, environ=env, maven_repo=tmp_path / "m2", progress=False)
        assert len(mvn_calls(bin_dir)) == 1

    def test_mvn_checksum_mismatch(self, tmp_path: Path, cache: Path) -> None:
        """A copy that does not match Maven's .sha1 fails and leaves nothing in the cache."""
        jar = make_jar()
        bad = "0" * 40
        bin_dir = tmp_path / "bin"
        write_fake_mvn(bin_dir, jar, digest=bad)
        with pytest.raises(JarDownloadError) as info:
            resolve_server_jar(VERSION, cache, environ={"PATH": str(bin_dir)}, maven_repo=tmp_path / "m2", progress=False)
        assert bad in str(info.value) and sha1(jar) in str(info.value)
        assert cache_files(cache) == []

    def test_mvn_failure(self, tmp_path: Path, cache: Path) -> None:
        """A failing mvn gives a JarDownloadError with its output, and an empty cache."""
        bin_dir = tmp_path / "bin"
        write_fake_mvn(bin_dir, make_jar(), fail=True)
        with pytest.raises(JarDownloadError) as info:
            resolve_server_jar(VERSION, cache, environ={"PATH": str(bin_dir)}, maven_repo=tmp_path / "m2", progress=False)
        assert "exit code 1" in str(info.value)
        assert "Could not find artifact" in info.value.log_tail
        assert isinstance(info.value, LocalServerError)
        assert cache_files(cache) == [f"{JAR_NAME}.maven.log"]  # no jar; Maven's log kept for the user

    @responses.activate
    def test_mvn_failure_falls_back_to_https(self, tmp_path: Path, cache: Path) -> None:
        """When mvn fails and a repository URL is set, the HTTPS download is tried."""
        jar = make_jar("fallback")
        responses.get(JAR_URL + ".sha1", body=sha1(jar))
        responses.get(JAR_URL, body=jar)
        bin_dir = tmp_path / "bin"
        write_fake_mvn(bin_dir, make_jar(), fail=True)
        env = {"PATH": str(bin_dir), MAVEN_REPOSITORY_ENV: REPO}
        path = resolve_server_jar(VERSION, cache, environ=env, maven_repo=tmp_path / "m2", progress=False)
        assert path.read_bytes() == jar

    def test_local_repository_from_settings(self, tmp_path: Path) -> None:
        """Maven's local repository comes from ~/.m2/settings.xml when it names one."""
        assert _maven.default_local_repository({"HOME": str(tmp_path)}) == tmp_path / ".m2" / "repository"
        (tmp_path / ".m2").mkdir()
        (tmp_path / ".m2" / "settings.xml").write_text(
            '<settings xmlns="urn:example:settings">'
            "<localRepository>${user.home}/repo</localRepository></settings>"
        )
        assert _maven.default_local_repository({"HOME": str(tmp_path)}) == tmp_path / "repo"


class TestHttps:
    @responses.activate
    def test_download_verified_and_cached(
        self, cache: Path, no_mvn_path: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """Without mvn the jar comes from the repository URL, checked against its .sha1."""
        jar = make_jar()
        responses.get(JAR_URL + ".sha1", body=f"{sha1(jar)}  {JAR_NAME}\n")
        responses.get(JAR_URL, body=jar, headers={"Content-Length": str(len(jar))})
        env = {"PATH": no_mvn_path, MAVEN_REPOSITORY_ENV: REPO + "/"}
        path = resolve_server_jar(VERSION, cache, environ=env)
        assert path == cache / JAR_NAME and path.read_bytes() == jar
        assert cache_files(cache) == [JAR_NAME]
        err = capsys.readouterr().err
        assert "100%" in err and "MB" in err

    @responses.activate
    def test_bad_checksum_leaves_nothing(self, cache: Path, no_mvn_path: str) -> None:
        """A jar whose SHA-1 differs from the published one is discarded with a clear error."""
        jar = make_jar()
        published = "f" * 40
        responses.get(JAR_URL + ".sha1", body=published)
        responses.get(JAR_URL, body=jar)
        env = {"PATH": no_mvn_path, MAVEN_REPOSITORY_ENV: REPO}
        with pytest.raises(JarDownloadError) as info:
            resolve_server_jar(VERSION, cache, environ=env, progress=False)
        message = str(info.value)
        assert "checksum mismatch" in message and published in message and sha1(jar) in message
        assert cache_files(cache) == []

    @responses.activate
    def test_not_found(self, cache: Path, no_mvn_path: str) -> None:
        """An unpublished version gives a 404 error naming the URL."""
        responses.get(JAR_URL + ".sha1", status=404)
        env = {"PATH": no_mvn_path, MAVEN_REPOSITORY_ENV: REPO}
        with pytest.raises(JarDownloadError) as info:
            resolve_server_jar(VERSION, cache, environ=env, progress=False)
        assert "404" in str(info.value) and JAR_URL in str(info.value)
        assert cache_files(cache) == []

    @responses.activate
    def test_leftovers_of_a_dead_download_are_removed(self, cache: Path, no_mvn_path: str) -> None:
        """Temporary files of an interrupted download are cleaned up by the next one."""
        cache.mkdir()
        (cache / f".{JAR_NAME}.dead1234.part").write_bytes(b"half a jar")
        jar = make_jar()
        responses.get(JAR_URL + ".sha1", body=sha1(jar))
        responses.get(JAR_URL, body=jar)
        resolve_server_jar(VERSION, cache, environ={"PATH": no_mvn_path, MAVEN_REPOSITORY_ENV: REPO}, progress=False)
        assert cache_files(cache) == [JAR_NAME]

    def test_repository_must_be_a_url(self, cache: Path, no_mvn_path: str) -> None:
        """A repository value that is not an http(s) URL names the variable."""
        with pytest.raises(ConfigurationError) as info:
            resolve_server_jar(VERSION, cache, environ={"PATH": no_mvn_path, MAVEN_REPOSITORY_ENV: "repo"})
        assert info.value.variable == MAVEN_REPOSITORY_ENV


class TestNoWayToDownload:
    def test_error_names_the_three_ways_out(self, cache: Path, no_mvn_path: str) -> None:
        """No mvn and no repository URL: the error says what to do."""
        with pytest.raises(JarDownloadError) as info:
            resolve_server_jar(VERSION, cache, environ={"PATH": no_mvn_path}, progress=False)
        message = str(info.value)
        assert "install Maven" in message
        assert MAVEN_REPOSITORY_ENV in message and "base URL of Maven Central or your mirror" in message
        assert SERVER_JAR_ENV in message
        assert cache_files(cache) == []

    def test_lock_wait_is_bounded(self, cache: Path, no_mvn_path: str) -> None:
        """While another process holds the download lock, the wait ends at the timeout."""
        cache.mkdir()
        with open(cache / f".{JAR_NAME}.lock", "a") as held:
            fcntl.flock(held.fileno(), fcntl.LOCK_EX)
            with pytest.raises(JarDownloadError) as info:
                resolve_server_jar(VERSION, cache, environ={"PATH": no_mvn_path}, timeout=0.2, progress=False)
        assert "another process" in str(info.value)

