"""The CLI's server record keeps a cluster's processes (balancer, nodes, Redis) and reads old records."""

from __future__ import annotations

import os
from pathlib import Path

from conductor_agents.local_server import _state


def test_a_cluster_record_round_trips_through_its_file(tmp_path: Path):
    members = (
        _state.MemberRecord.for_process("node-1", os.getpid(), tmp_path / "node-1.log"),
        _state.MemberRecord("redis-server", 999_999_999, tmp_path / "redis.log"),
    )
    record = _state.ServerRecord.for_process(pid=os.getpid(), port=8080, data_dir=tmp_path, log_path=tmp_path / "x",
                                             version="3.32.3", detached=True, backend="redis", members=members)
    path = tmp_path / "server.json"
    _state.save(path, record)
    loaded = _state.load(path)
    assert loaded == record
    assert [m.is_alive() for m in loaded.members] == [True, False]


def test_a_record_written_before_clusters_reads_as_sqlite_with_no_members(tmp_path: Path):
    path = tmp_path / "server.json"
    path.write_text('{"pid": 1, "port": 8080, "data_dir": "/d", "log_path": "/d/server.log"}')
    loaded = _state.load(path)
    assert loaded is not None and loaded.backend == "sqlite" and loaded.members == ()
