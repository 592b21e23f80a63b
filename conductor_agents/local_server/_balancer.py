"""``Balancer``: HAProxy on loopback in front of the cluster's Conductor nodes.

Round-robin over every healthy node, no stickiness, health checks on ``/health`` every
second (a node is out after two failed checks and back after one good one); a request
that cannot connect to a node is retried on another one. Timeouts are long enough for
long polls and the ``/agent/stream`` event stream.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .._common.clock import SYSTEM_CLOCK, Clock
from . import _http
from ._aux import AuxService

HAPROXY_PACKAGE = "haproxy"
_HEALTH_PROBE_TIMEOUT = 2.0


def haproxy_config(port: int, node_ports: Sequence[int]) -> str:
    """The HAProxy configuration for a balancer on ``port`` over ``node_ports``."""
    servers = "\n".join(f"    server node{i} 127.0.0.1:{p} check" for i, p in enumerate(node_ports, start=1))
    return f"""# Written by conductor-agents (LocalCluster); rewritten at every start.
global
    # no maxconn: HAProxy derives it from the open-files limit (ulimit -n)
    log stdout format raw local0 notice

defaults
    mode http
    log global
    option redispatch
    retries 3
    timeout connect 2s
    timeout client 1h
    timeout server 1h
    timeout http-request 30s
    timeout http-keep-alive 60s
    timeout queue 30s

frontend conductor
    bind 127.0.0.1:{port}
    default_backend nodes

backend nodes
    balance roundrobin
    option httpchk GET /health
    http-check expect status 200
    default-server inter 1s fastinter 500ms fall 2 rise 1 on-marked-down shutdown-sessions
{servers}
"""


class Balancer(AuxService):
    """An ``haproxy`` child process; the port is kept across restarts.

    Thread-safety: start/stop serialize on the underlying process lock.
    """

    binary, package, label = "haproxy", HAPROXY_PACKAGE, "balancer"

    def __init__(
        self,
        data_dir: Path,
        *,
        port: int | None = None,
        detached: bool = False,
        startup_timeout: float = 60.0,
        stop_timeout: float = 20.0,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        super().__init__(data_dir, port=port, log_path=data_dir / "haproxy.log", detached=detached,
                         startup_timeout=startup_timeout, stop_timeout=stop_timeout, clock=clock)

    @property
    def config_path(self) -> Path:
        """The configuration file written at start."""
        return self.data_dir / "haproxy.cfg"

    def start(self, node_ports: Sequence[int]) -> Balancer:
        """Write the configuration and start HAProxy; wait until it routes ``/health`` to a node.

        Raises:
            LocalServerError: haproxy is missing, the port is taken or it did not start.
        """
        def args(binary: str, port: int) -> list[str]:
            self.config_path.write_text(haproxy_config(port, node_ports), encoding="utf-8")
            # -db: stay in the foreground (we own the process); -f: our configuration only.
            return [binary, "-db", "-f", str(self.config_path)]

        self._start_process(args)
        return self

    def _ready(self) -> bool:
        return self._port is not None and _http.probe_health(f"http://127.0.0.1:{self._port}", _HEALTH_PROBE_TIMEOUT)
