"""Helpers shared by the test suites."""

from __future__ import annotations

import threading
import time
from typing import Callable, Optional, TypeVar

import requests

from conductor_agents import Agent, Continuation, ToolRegistry, WaitForMessageTool
from conductor_agents._listener.chain import link_id, link_key, parse_link_key
from conductor_agents._serving.leases import lease_execution_id

T = TypeVar("T")


def eventually(check: Callable[[], T], *, timeout: float = 10.0, interval: float = 0.05,
               message: str = "condition") -> T:
    """Call ``check`` until it returns something truthy or ``timeout`` passes (then AssertionError)."""
    deadline = time.monotonic() + timeout
    last: T = check()
    while not last:
        if time.monotonic() > deadline:
            raise AssertionError(f"{message} not reached within {timeout}s (last value: {last!r})")
        time.sleep(interval)
        last = check()
    return last


def lease_owner(base_url: str, domain: str, epoch: int) -> Optional[str]:
    """The worker id that owns lease ``epoch`` of ``domain``, read straight from the server: None if
    that lease was never taken (no such record), "" if it was taken as a release (no owner)."""
    response = requests.get(f"{base_url}/workflow/{lease_execution_id(domain, epoch)}",
                            params={"includeTasks": "false"}, timeout=10)
    if response.status_code == 404:
        return None
    response.raise_for_status()
    return response.json()["input"]["context"]["owner"]


def listener_runs(base_url: str, execution_id: str) -> "list[str]":
    """Every run of the listener whose first run is ``execution_id``, first to newest, from the server.

    Found the way any process finds them: the first run's correlation id names its chain, and each
    later run has a known id; they are probed in turn until one does not exist.
    """
    first = requests.get(f"{base_url}/workflow/{execution_id}", params={"includeTasks": "false"}, timeout=10)
    first.raise_for_status()
    key = parse_link_key(first.json().get("correlationId"))
    runs = [execution_id]
    if key is None:
        return runs
    number = key.number
    while True:
        number += 1
        candidate = link_id(key.agent_name, link_key(key.run_id, number, key.agent_name))
        response = requests.get(f"{base_url}/workflow/{candidate}", params={"includeTasks": "false"}, timeout=10)
        if response.status_code == 404:
            return runs
        response.raise_for_status()
        runs.append(candidate)


def sdk_threads() -> "list[str]":
    """Names of the live threads this SDK started."""
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("conductor-agents-")
                  and not t.name.startswith("conductor-agents-scripted-llm"))


def listener(name: str, model: str, tools: object, *, batch_size: int = 1,
             continuation: "Continuation | None" = None) -> Agent:
    """A stateful listener: wait for messages (up to ``batch_size`` at once), act with ``tools``' methods."""
    receive = WaitForMessageTool.create(name="wait_for_message", batch_size=batch_size)
    return Agent(
        name=name,
        model=model,
        stateful=True,
        max_turns=10_000,
        tools=[receive, *ToolRegistry.from_instance(tools)],
        instructions="Loop: wait_for_message, act on it, repeat until told to stop.",
        continuation=continuation,
    )
