"""LocalServer's backend choice and LocalCluster's parts, without starting anything."""

from __future__ import annotations

import pytest

from conductor_agents.errors import ConfigurationError, LocalServerError
from conductor_agents.local_server import LocalCluster, LocalServer
from conductor_agents.local_server._aux import find_binary
from conductor_agents.local_server._balancer import haproxy_config
from conductor_agents.local_server._redis import redis_server_properties


def test_backend_must_be_sqlite_or_redis():
    with pytest.raises(ConfigurationError, match="backend"):
        LocalServer(backend="mongo")
    with pytest.raises(ConfigurationError, match="redis_port"):
        LocalServer(redis_port=6379)
    assert LocalServer(backend="redis").backend == "redis"


def test_cluster_arguments_are_checked():
    with pytest.raises(ConfigurationError):
        LocalCluster(nodes=0)
    with pytest.raises(ConfigurationError):
        LocalCluster(detached=True)
    with pytest.raises(LocalServerError):
        LocalCluster().url  # never started: no port yet


def test_a_missing_binary_names_its_package(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(LocalServerError, match="install the package 'haproxy'"):
        find_binary("haproxy", "haproxy")


def test_the_balancer_is_round_robin_over_every_node_with_health_checks_on_loopback():
    cfg = haproxy_config(8080, [9001, 9002])
    assert "bind 127.0.0.1:8080" in cfg
    assert "balance roundrobin" in cfg and "option httpchk GET /health" in cfg
    assert "server node1 127.0.0.1:9001 check" in cfg and "server node2 127.0.0.1:9002 check" in cfg
    assert "cookie" not in cfg and "stick" not in cfg  # no stickiness


def test_redis_properties_share_one_redis_for_data_queues_and_lock():
    props = redis_server_properties(6390)
    assert props["conductor.db.type"] == props["conductor.queue.type"] == "redis_standalone"
    assert props["conductor.redis.hosts"].startswith("127.0.0.1:6390:")
    assert props["conductor.redis-lock.serverAddress"] == "redis://127.0.0.1:6390"
    assert props["conductor.workflow-execution-lock.type"] == "redis"
    assert props["conductor.indexing.enabled"] == "false"
    assert props["conductor.workflow-message-queue.enabled"] == "true"
