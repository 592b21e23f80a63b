"""The serving process's checks of its mailboxes (_listener.mailbox_checks): a decide of each watched mailbox every
``every`` seconds and soon after each forward, none for a mailbox forgotten, one thread that ends when idle."""

from __future__ import annotations

import threading
import time

import pytest

from conductor_agents._listener import mailbox_checks
from conductor_agents._listener.mailbox_checks import MailboxChecks
from conductor_agents.errors import ExecutionNotFoundError, ServerUnavailableError

from tests.helpers import eventually


class Decides:
    """An api that records each ``decide_workflow`` (and raises what ``errors`` holds for an id, once)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[tuple[str, float]] = []
        self.errors: dict[str, Exception] = {}

    def decide_workflow(self, execution_id: str) -> None:
        with self.lock:
            self.calls.append((execution_id, time.monotonic()))
            error = self.errors.pop(execution_id, None)
        if error is not None:
            raise error

    def of(self, execution_id: str) -> list[float]:
        with self.lock:
            return [at for e, at in self.calls if e == execution_id]


@pytest.fixture
def checks(monkeypatch):
    monkeypatch.setattr(mailbox_checks, "AFTER_ROUND_SECONDS", 0.05)  # a first check soon after a watch
    api = Decides()
    made = MailboxChecks(api, every=0.2, stopping=threading.Event())  # type: ignore[arg-type]
    made.api = api  # type: ignore[attr-defined]
    yield made
    made.close(5)


def _thread_alive() -> bool:
    return any(t.name == "conductor-agents-mailbox-checks" and t.is_alive() for t in threading.enumerate())


def test_each_watched_mailbox_is_decided_every_period_and_a_forgotten_one_no_more(checks):
    checks.watch("a")
    checks.watch("b")
    eventually(lambda: len(checks.api.of("a")) >= 3 and len(checks.api.of("b")) >= 3, timeout=10, interval=0.05,
               message="three checks of each")
    times = checks.api.of("a")
    assert all(later - earlier >= 0.15 for earlier, later in zip(times, times[1:])), times  # not more often
    checks.forget("a")
    seen = len(checks.api.of("a"))
    time.sleep(0.6)  # bounded: three periods
    assert len(checks.api.of("a")) <= seen + 1  # at most one already under way as it was forgotten
    assert len(checks.api.of("b")) >= 5


def test_a_forward_brings_the_next_two_checks_forward(checks, monkeypatch):
    """Two decides soon after a forward (its next rest has rested a second by the first, or on a loaded server by the
    second), then back to the period; the first check of a mailbox also comes soon (it rests as it opens)."""
    monkeypatch.setattr(mailbox_checks, "_FIRST_SPREAD", 0.0)
    slow = MailboxChecks(checks.api, every=3600, stopping=threading.Event())  # type: ignore[arg-type]
    try:
        slow.watch("m")
        eventually(lambda: len(checks.api.of("m")) == 1, timeout=5, interval=0.02, message="the first check")
        time.sleep(0.3)  # bounded: the next one is an hour away
        assert len(checks.api.of("m")) == 1
        slow.soon("m")
        eventually(lambda: len(checks.api.of("m")) == 3, timeout=5, interval=0.02, message="two checks after a round")
        slow.soon("unwatched")  # a mailbox not served here: nothing
        time.sleep(0.3)  # bounded
        assert checks.api.of("unwatched") == [] and len(checks.api.of("m")) == 3
    finally:
        slow.close(5)


@pytest.fixture
def spreading(monkeypatch):
    """Makes ``(api, checks)`` with ``every`` and ``most`` given, the first check soon after a watch; closes them."""
    monkeypatch.setattr(mailbox_checks, "AFTER_ROUND_SECONDS", 0.02)
    monkeypatch.setattr(mailbox_checks, "_FIRST_SPREAD", 0.0)
    made: list[MailboxChecks] = []

    def make(every: float, most: float) -> tuple[Decides, MailboxChecks]:
        api = Decides()
        made.append(MailboxChecks(api, every=every, most=most, stopping=threading.Event()))  # type: ignore[arg-type]
        return api, made[-1]

    yield make
    for checks in made:
        checks.close(5)


def test_the_checks_of_an_idle_mailbox_come_ever_further_apart_up_to_the_most_and_a_forward_starts_again(spreading):
    """Each check of an idle mailbox is a round of its own (a young rest after it), so checking at a fixed period cost
    a round per period per idle listener for ever: the gaps double, ``every`` then up to ``most``; a forward (a message
    came) has the two checks soon after it, then ``every`` again."""
    api, checks = spreading(every=0.1, most=0.4)
    checks.watch("m")
    assert checks.gap("m") == 0.1
    eventually(lambda: len(api.of("m")) >= 5, timeout=20, interval=0.02, message="five idle checks")
    times = api.of("m")[:5]
    gaps = [later - earlier for earlier, later in zip(times, times[1:])]
    assert [round(g, 2) >= want for g, want in zip(gaps, (0.1, 0.2, 0.4, 0.4))] == [True] * 4, gaps
    assert checks.gap("m") == 0.4  # the most: it doubles no further
    seen = len(api.of("m"))
    checks.soon("m")
    assert checks.gap("m") == 0.1
    eventually(lambda: len(api.of("m")) >= seen + 3, timeout=20, interval=0.02, message="two soon, one idle")
    after = api.of("m")[seen - 1:seen + 3]
    assert round(after[3] - after[2], 2) >= 0.1, after  # the first idle gap after a round is ``every`` again
    assert checks.gap("m") in (0.2, 0.4)  # doubling again from there (one more check may have come)
    assert checks.gap("unwatched") is None
    checks.forget("m")
    assert checks.gap("m") is None


def test_a_most_below_every_means_every(spreading):
    api, checks = spreading(every=0.1, most=0.05)
    checks.watch("m")
    eventually(lambda: len(api.of("m")) >= 3, timeout=20, interval=0.02, message="three idle checks")
    assert checks.gap("m") == 0.1


def test_a_mailbox_the_server_does_not_know_is_forgotten_and_a_failed_check_is_tried_again(checks, monkeypatch):
    monkeypatch.setattr(mailbox_checks, "_AFTER_FAILURE", 0.05)
    checks.api.errors["gone"] = ExecutionNotFoundError("no such run", execution_id="gone")
    checks.api.errors["flaky"] = ServerUnavailableError("down")
    checks.watch("gone")
    checks.watch("flaky")
    eventually(lambda: len(checks.api.of("flaky")) >= 2, timeout=10, interval=0.05, message="tried again")
    time.sleep(0.5)  # bounded: a few periods
    assert len(checks.api.of("gone")) == 1 and checks.watched() == 1


def test_the_thread_ends_when_nothing_is_watched_and_none_starts_after_close(checks):
    checks.watch("m")
    eventually(lambda: checks.api.of("m"), timeout=5, interval=0.02, message="a check")
    checks.forget("m")
    eventually(lambda: not _thread_alive(), timeout=10, interval=0.05, message="the idle thread ended")
    checks.watch("again")  # a new watch starts a new thread
    eventually(lambda: checks.api.of("again"), timeout=5, interval=0.02, message="a check after a new watch")
    checks.close(5)
    assert not _thread_alive()
    checks.watch("after-close")
    time.sleep(0.4)  # bounded: two periods
    assert checks.api.of("after-close") == [] and not _thread_alive()
