"""The ports the local parts start on (``local_server/_proc.py``): a free one chosen for each part, never the same
one twice in a process while their servers come up (a cluster's parts start at once), and another one when another
process took the chosen port before the check (CI: a cluster's node met the other test worker's server there)."""

from __future__ import annotations

import socket
import threading

import pytest

from conductor_agents.errors import LocalServerError
from conductor_agents.local_server import _proc


def test_parts_starting_at_once_are_never_given_the_same_port():
    ports: "list[int]" = []
    lock = threading.Lock()

    def pick() -> None:
        for _ in range(20):
            port = _proc.free_port()
            with lock:
                ports.append(port)

    threads = [threading.Thread(target=pick) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(ports) == 80 and len(set(ports)) == 80


def test_a_chosen_port_taken_before_the_check_is_replaced_by_another(monkeypatch):
    real = _proc.port_is_free
    seen: "list[int]" = []

    def taken_once(port: int) -> bool:
        seen.append(port)
        return len(seen) > 1 and real(port)

    monkeypatch.setattr(_proc, "port_is_free", taken_once)
    port = _proc.claim_port(None)
    assert len(seen) == 2 and port == seen[1] != seen[0]


def test_a_given_port_is_kept_when_free_and_refused_when_in_use():
    port = _proc.free_port()
    assert _proc.claim_port(port) == port
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        with pytest.raises(LocalServerError, match=f"port {busy} on 127.0.0.1 is already in use \\(Redis\\)"):
            _proc.claim_port(busy, "Redis")


def test_no_free_port_after_a_few_tries_is_an_error(monkeypatch):
    monkeypatch.setattr(_proc, "port_is_free", lambda port: False)
    with pytest.raises(LocalServerError, match="no free port"):
        _proc.claim_port(None, "HAProxy")
