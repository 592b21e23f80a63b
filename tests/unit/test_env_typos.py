"""Unknown CONDUCTOR_AGENT_* / CONDUCTOR_AGENTS_* variables: a warning naming the closest known one (issue 11)."""

from __future__ import annotations

import warnings

import pytest

from conductor_agents.settings import ENV_VARS, OTHER_KNOWN_VARS, AgentSettings


def warnings_of(environ):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        AgentSettings.from_env(environ)
    return [str(w.message) for w in caught if issubclass(w.category, UserWarning)]


@pytest.mark.parametrize("typo,meant", [
    ("CONDUCTOR_AGENT_WORKER_THREAD", "CONDUCTOR_AGENT_WORKER_THREADS"),
    ("CONDUCTOR_AGENT_LIVENES_ENABLED", "CONDUCTOR_AGENT_LIVENESS_ENABLED"),
    ("CONDUCTOR_AGENTS_WORKER_THREADS", "CONDUCTOR_AGENT_WORKER_THREADS"),
    ("CONDUCTOR_AGENTS_MAVEN_REPO", "CONDUCTOR_AGENTS_MAVEN_REPOSITORY"),
    ("CONDUCTOR_AGENT_MODLE", "CONDUCTOR_AGENT_MODEL"),
])
def test_a_typo_warns_and_names_the_closest_known_variable(typo, meant):
    [message] = warnings_of({typo: "8"})
    assert typo in message and f"did you mean {meant}?" in message
    assert "8" not in message.replace(typo, "").replace(meant, "")  # the value is not echoed (it may be a secret)


def test_every_known_variable_is_silent():
    environ = {name: "" for name in ENV_VARS} | {name: "x" for name in OTHER_KNOWN_VARS}
    assert [] == warnings_of(environ)


def test_other_families_are_not_ours():
    """CONDUCTOR_SERVER_URL-like names of other tools, and look-alike prefixes, say nothing."""
    assert [] == warnings_of({"CONDUCTOR_SERVER_VERSION": "3", "CONDUCTOR_UI_PORT": "5000",
                              "CONDUCTOR_AGENTX": "1", "MY_CONDUCTOR_AGENT_THREADS": "2"})


def test_the_unknown_variable_is_ignored_not_applied():
    with pytest.warns(UserWarning, match="CONDUCTOR_AGENT_WORKER_THREAD "):
        settings = AgentSettings.from_env({"CONDUCTOR_AGENT_WORKER_THREAD": "3"})
    assert settings.worker_threads == AgentSettings().worker_threads


def test_the_warning_points_at_the_callers_line():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        AgentSettings.from_env({"CONDUCTOR_AGENT_WORKER_THREAD": "3"})
    assert [__file__] == [w.filename for w in caught]
