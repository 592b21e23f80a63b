"""LocalServer's backend choice and LocalCluster's parts, without starting anything."""

from __future__ import annotations

import pytest

from conductor_agents.errors import ConfigurationError, LocalServerError
from conductor_agents.local_server import DEFAULT_JVM_OPTIONS, LocalCluster, LocalServer
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


@pytest.mark.parametrize("options, message", [
    ({"startup_timeout": 0}, "^startup_timeout must be a number > 0, got 0$"),
    ({"stop_timeout": -1.0}, "^stop_timeout must be a number > 0, got -1.0$"),
    ({"startup_timeout": "5"}, "^startup_timeout must be a number > 0, got '5'$"),
    ({"stop_timeout": True}, r"^stop_timeout must be a number > 0 \(not a bool\), got True$"),
    ({"properties": {"server.port": 1}}, "set the port with port="),
    ({"env": {"A": 1}}, "env must map str to str"),
    ({"secrets": {"bad name": "v"}}, "bad name"),
])
def test_server_and_cluster_check_the_node_options_they_share_when_made(options, message):
    """One check for both: a cluster refuses a bad node option when it is made, not when a node starts."""
    for make in (LocalServer, LocalCluster):
        with pytest.raises(ConfigurationError, match=message):
            make(**options)


def test_a_cluster_hands_its_nodes_the_options_it_was_given(tmp_path):
    cluster = LocalCluster(tmp_path, version="3.32.3", env={"K": "v"}, properties={"a.b": 1}, jvm_options=["-Xmx2g"],
                           startup_timeout=5, stop_timeout=3, progress=False, secrets={"TOKEN": "s3cret-value"})
    node = LocalServer(tmp_path / "node-1", backend="redis", redis_port=6379, **cluster._node_options.as_kwargs())
    assert node._options == cluster._node_options
    assert node._options.properties == {"a.b": "1"} and node._options.jvm_options == ("-Xmx2g",)
    assert node._options.startup_timeout == 5.0 and node._options.secret_env == {"CONDUCTOR_SECRET_TOKEN": "s3cret-value"}
    assert LocalServer(tmp_path)._options.jvm_options == DEFAULT_JVM_OPTIONS


def test_node_options_check_and_build_the_secrets_environment_once(monkeypatch):
    from conductor_agents.local_server import _node_options

    built: list[object] = []
    real = _node_options.secret_environment
    monkeypatch.setattr(_node_options, "secret_environment", lambda secrets: built.append(secrets) or real(secrets))
    options = _node_options.NodeOptions(secrets={"TOKEN": "s3cret-value"})
    assert options.secret_env is options.secret_env == {"CONDUCTOR_SECRET_TOKEN": "s3cret-value"}
    assert 1 == len(built)
    assert "secret_env" not in options.as_kwargs() and "s3cret" not in repr(options)


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
