"""Unit tests for conductor_agents._listener.chain (how a continued listener's runs are named) and _budget."""

import pytest

from conductor_agents._listener.budget import RunSize, SizeModel
from conductor_agents._listener.chain import (
    ABANDONED_REASON, LinkKey, continued_reason, is_abandoned, is_continued, link_id, link_key, parse_link_key,
    run_id_for_key,
)

RUN = "a8719efd94e74b23bcb53f21ccc45c08"


def test_link_ids_are_the_servers():
    """The id the real server (3.32.3) gave an agent started with this name and key (seen in a probe)."""
    assert "a4d6f029-556b-3108-b18e-c6e922fc0425" == link_id("prefill1796161820", f"ca:{RUN}:1")


def test_a_link_key_round_trips_and_names_its_id():
    key = LinkKey(RUN, 7, "listener-one")
    assert key == parse_link_key(key.key) and key.key == link_key(RUN, 7, "listener-one")
    assert key.execution_id == link_id("listener-one", key.key)


@pytest.mark.parametrize("value", [None, "", "order-42", f"conductor-agents/{RUN}/x/agent",
                                   f"conductor-agents/{RUN[:-1]}/1/agent", f"conductor-agents/{RUN}/1/bad name"])
def test_other_correlation_ids_are_not_links(value):
    assert parse_link_key(value) is None


def test_a_callers_key_always_gives_the_same_run_id():
    assert run_id_for_key("a", "k") == run_id_for_key("a", "k") != run_id_for_key("a", "k2") != run_id_for_key("b", "k")
    assert len(run_id_for_key("a", "k")) == 32 and parse_link_key(link_key(run_id_for_key("a", "k"), 0, "a"))


def test_reasons_tell_continued_from_abandoned():
    assert is_continued(continued_reason("x")) and not is_abandoned(continued_reason("x"))
    assert is_abandoned(f"{ABANDONED_REASON}: the previous run completed") and not is_continued(ABANDONED_REASON)
    assert not is_continued(None) and not is_continued("cancelled by the caller")


# --- _budget ----------------------------------------------------------------------------------------


def test_the_size_model_learns_an_agents_bytes_per_task_once():
    sizes = SizeModel()
    small = RunSize(tasks=20, turns=2, digest=1_000)
    assert not sizes.needs_measurement("a", small)  # too early to learn from
    size = RunSize(tasks=40, turns=4, digest=2_000)
    assert sizes.needs_measurement("a", size)
    assert 10_000 == sizes.measured("a", size, 40 * 10_000 + int(9 * 4 * 2_000))
    assert not sizes.needs_measurement("a", size) and sizes.needs_measurement("b", size)
    assert 40 * 10_000 + 9 * 4 * 2_000 == sizes.estimate("a", size)


def test_one_run_of_an_agent_measures_at_a_time_and_a_failed_read_lets_another_take_it():
    """Many listeners of one agent at their calibrating turn at once: one full read of a run, not one each."""
    sizes = SizeModel()
    size = RunSize(tasks=40, turns=4, digest=2_000)
    assert sizes.needs_measurement("a", size)
    assert not sizes.needs_measurement("a", size)  # the first one's read is under way
    sizes.measurement_failed("a")
    assert sizes.needs_measurement("a", size)  # so another run takes it
    sizes.measured("a", size, 400_000)
    assert not sizes.needs_measurement("a", size)


def test_turns_left_shrink_as_the_digest_grows():
    sizes = SizeModel()
    light = sizes.turns_until("a", RunSize(tasks=40, turns=4, digest=2_000), 1_000_000)
    heavy = sizes.turns_until("a", RunSize(tasks=40, turns=4, digest=40_000), 1_000_000)
    assert light > 3 > heavy >= 0
    assert 0 == sizes.turns_until("a", RunSize(tasks=200, turns=20, digest=50_000), 1_000_000)
