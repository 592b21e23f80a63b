"""Unit tests for conductor_agents.settings: AgentSettings.from_env and the field validators."""

from datetime import timedelta

import attrs
import pytest

from conductor_agents.errors import ConfigurationError
from conductor_agents.settings import ENV_VARS, AgentSettings

SECRET = "s3cr3t-Do-Not-Print-7f2a"

#: One good value per variable, none of them the default, and the field value it must give.
GOOD = {
    "CONDUCTOR_SERVER_URL": ("https://conductor.example.com/api/", "server_url", "https://conductor.example.com/api"),
    "CONDUCTOR_AUTH_KEY": ("key-id-1", "auth_key", "key-id-1"),
    "CONDUCTOR_AUTH_SECRET": (SECRET, "auth_secret", SECRET),
    "CONDUCTOR_AGENT_WORKER_THREADS": (" 7 ", "worker_threads", 7),
    "CONDUCTOR_AGENT_WORKER_POLL_INTERVAL": ("250", "worker_poll_interval_ms", 250),
    "CONDUCTOR_AGENT_AUTO_START_WORKERS": ("false", "auto_start_workers", False),
    "CONDUCTOR_AGENT_LIVENESS_ENABLED": ("OFF", "liveness_enabled", False),
    "CONDUCTOR_AGENT_LIVENESS_CHECK_INTERVAL_SECONDS": ("2.5", "liveness_check_interval_seconds", 2.5),
    "CONDUCTOR_AGENT_LIVENESS_STALL_SECONDS": ("45", "liveness_stall_seconds", 45.0),
    "CONDUCTOR_AGENT_CONTINUATION_ENABLED": ("no", "continuation_enabled", False),
    "CONDUCTOR_AGENT_CONTINUE_AFTER_TURNS": ("12", "continue_after_turns", 12),
    "CONDUCTOR_AGENT_CONTINUE_AFTER_BYTES": ("500000", "continue_after_bytes", 500_000),
    "CONDUCTOR_AGENT_KEEP_RUNS": ("5", "keep_runs", 5),
    "CONDUCTOR_AGENT_KEEP_FOR": ("30d", "keep_for", timedelta(days=30)),
    "CONDUCTOR_AGENT_PENDING_CHECK_INTERVAL_SECONDS": ("1.5", "pending_check_interval_seconds", 1.5),
    "CONDUCTOR_AGENT_MAILBOX_CHECK_SECONDS": (" 3 ", "mailbox_check_seconds", 3),
    "CONDUCTOR_AGENT_MAILBOX_CHECK_MAX_SECONDS": ("600", "mailbox_check_max_seconds", 600),
    "CONDUCTOR_AGENT_LISTENER_WAIT": ("pull", "listener_wait", "pull"),
}

#: Malformed values of every variable that has a format (key and secret are free text).
BAD = [
    ("CONDUCTOR_SERVER_URL", "localhost:8080/api"),
    ("CONDUCTOR_SERVER_URL", "ftp://conductor.example.com/api"),
    ("CONDUCTOR_SERVER_URL", "http://"),
    ("CONDUCTOR_AGENT_WORKER_THREADS", "0"),
    ("CONDUCTOR_AGENT_WORKER_THREADS", "-3"),
    ("CONDUCTOR_AGENT_WORKER_THREADS", "four"),
    ("CONDUCTOR_AGENT_WORKER_THREADS", "2.5"),
    ("CONDUCTOR_AGENT_WORKER_POLL_INTERVAL", "0"),
    ("CONDUCTOR_AGENT_WORKER_POLL_INTERVAL", "100ms"),
    ("CONDUCTOR_AGENT_AUTO_START_WORKERS", "maybe"),
    ("CONDUCTOR_AGENT_AUTO_START_WORKERS", "2"),
    ("CONDUCTOR_AGENT_LIVENESS_ENABLED", "disabled"),
    ("CONDUCTOR_AGENT_LIVENESS_CHECK_INTERVAL_SECONDS", "0"),
    ("CONDUCTOR_AGENT_LIVENESS_CHECK_INTERVAL_SECONDS", "-1"),
    ("CONDUCTOR_AGENT_LIVENESS_CHECK_INTERVAL_SECONDS", "nan"),
    ("CONDUCTOR_AGENT_LIVENESS_CHECK_INTERVAL_SECONDS", "inf"),
    ("CONDUCTOR_AGENT_LIVENESS_STALL_SECONDS", "30s"),
    ("CONDUCTOR_AGENT_LIVENESS_STALL_SECONDS", "0.0"),
    ("CONDUCTOR_AGENT_CONTINUATION_ENABLED", "sometimes"),
    ("CONDUCTOR_AGENT_CONTINUE_AFTER_TURNS", "1"),
    ("CONDUCTOR_AGENT_CONTINUE_AFTER_TURNS", "ten"),
    ("CONDUCTOR_AGENT_CONTINUE_AFTER_BYTES", "99999"),
    ("CONDUCTOR_AGENT_CONTINUE_AFTER_BYTES", "1MB"),
    ("CONDUCTOR_AGENT_KEEP_RUNS", "-1"),
    ("CONDUCTOR_AGENT_KEEP_RUNS", "some"),
    ("CONDUCTOR_AGENT_KEEP_FOR", "0"),
    ("CONDUCTOR_AGENT_KEEP_FOR", "-2h"),
    ("CONDUCTOR_AGENT_KEEP_FOR", "a week"),
    ("CONDUCTOR_AGENT_KEEP_FOR", "3w"),
    ("CONDUCTOR_AGENT_PENDING_CHECK_INTERVAL_SECONDS", "0"),
    ("CONDUCTOR_AGENT_PENDING_CHECK_INTERVAL_SECONDS", "soon"),
    ("CONDUCTOR_AGENT_MAILBOX_CHECK_SECONDS", "0"),
    ("CONDUCTOR_AGENT_MAILBOX_CHECK_SECONDS", "2.5"),
    ("CONDUCTOR_AGENT_MAILBOX_CHECK_SECONDS", "30s"),
    ("CONDUCTOR_AGENT_MAILBOX_CHECK_MAX_SECONDS", "0"),
    ("CONDUCTOR_AGENT_MAILBOX_CHECK_MAX_SECONDS", "8m"),
    ("CONDUCTOR_AGENT_LISTENER_WAIT", "poll"),
]


def test_env_vars_table_is_pinned():
    """ENV_VARS lists exactly the documented variables, so a new one cannot go untested."""
    assert sorted(GOOD) == sorted(ENV_VARS)


def test_every_variable_is_parsed():
    """Every variable of ENV_VARS sets its field from the environment."""
    settings = AgentSettings.from_env({name: raw for name, (raw, _, _) in GOOD.items()})
    expected = {field: value for _, field, value in GOOD.values()}
    actual = {field: getattr(settings, field) for field in expected}
    assert expected == actual


@pytest.mark.parametrize("name", sorted(GOOD))
def test_each_variable_alone_changes_only_its_field(name):
    """One variable set changes its own field and leaves every other at the default."""
    raw, field, value = GOOD[name]
    env = {name: raw}
    if name == "CONDUCTOR_AUTH_KEY":
        env["CONDUCTOR_AUTH_SECRET"] = SECRET
    if name == "CONDUCTOR_AUTH_SECRET":
        env["CONDUCTOR_AUTH_KEY"] = "key-id-1"
    settings = AgentSettings.from_env(env)
    changed = {f.name for f in attrs.fields(AgentSettings)
               if getattr(settings, f.name) != getattr(AgentSettings(), f.name)}
    expected_changed = {field} | ({"auth_key", "auth_secret"} if field.startswith("auth_") else set())
    assert expected_changed == changed
    assert value == getattr(settings, field)


def test_defaults():
    """With an empty environment every setting has its documented default."""
    settings = AgentSettings.from_env({})
    expected = {
        "server_url": "http://localhost:8080/api", "auth_key": None, "auth_secret": None,
        "worker_threads": 16, "worker_poll_interval_ms": 100, "auto_start_workers": True,
        "liveness_enabled": True, "liveness_check_interval_seconds": 10.0,
        "liveness_stall_seconds": 30.0, "status_poll_interval_seconds": 0.5,
        "wait_timeout_seconds": 600.0, "max_transient_errors": 3, "mailbox_check_seconds": 30,
        "mailbox_check_max_seconds": 480,
    }
    assert expected == {name: getattr(settings, name) for name in expected}
    assert AgentSettings() == settings


def test_blank_values_count_as_unset():
    """A variable set to blanks is ignored rather than an error."""
    assert AgentSettings() == AgentSettings.from_env({name: "  " for name in ENV_VARS})


@pytest.mark.parametrize("raw", ["1", "true", "YES", "on", " True "])
def test_true_spellings(raw):
    """The accepted spellings of true parse as True."""
    assert True is AgentSettings.from_env({"CONDUCTOR_AGENT_LIVENESS_ENABLED": "no",
                                           "CONDUCTOR_AGENT_AUTO_START_WORKERS": raw}).auto_start_workers


@pytest.mark.parametrize("raw", ["0", "false", "No", "off"])
def test_false_spellings(raw):
    """The accepted spellings of false parse as False."""
    assert False is AgentSettings.from_env({"CONDUCTOR_AGENT_LIVENESS_ENABLED": raw}).liveness_enabled


@pytest.mark.parametrize("name,raw", BAD)
def test_malformed_value_names_the_variable(name, raw):
    """A malformed value raises ConfigurationError whose message and .variable name the variable."""
    with pytest.raises(ConfigurationError) as info:
        AgentSettings.from_env({name: raw, "CONDUCTOR_AUTH_KEY": "k", "CONDUCTOR_AUTH_SECRET": SECRET})
    assert name == info.value.variable
    assert name in str(info.value)
    assert SECRET not in str(info.value)
    assert isinstance(info.value, ValueError)


def test_os_environ_is_the_default_source(monkeypatch):
    """Without an explicit mapping, from_env reads os.environ."""
    monkeypatch.setenv("CONDUCTOR_AGENT_WORKER_THREADS", "3")
    assert 3 == AgentSettings.from_env().worker_threads


def test_explicit_overrides_beat_the_environment():
    """A keyword override wins over the variable of the same setting."""
    env = {"CONDUCTOR_AGENT_WORKER_THREADS": "4", "CONDUCTOR_SERVER_URL": "http://env.example/api"}
    settings = AgentSettings.from_env(env, worker_threads=9, server_url="http://arg.example/api/")
    assert (9, "http://arg.example/api") == (settings.worker_threads, settings.server_url)


def test_malformed_variable_is_an_error_even_with_an_override():
    """A malformed variable is an error even when an override for it is given (typos never hide)."""
    with pytest.raises(ConfigurationError) as info:
        AgentSettings.from_env({"CONDUCTOR_AGENT_WORKER_THREADS": "x"}, worker_threads=2)
    assert "CONDUCTOR_AGENT_WORKER_THREADS" == info.value.variable


def test_key_without_secret_is_an_error():
    """CONDUCTOR_AUTH_KEY without CONDUCTOR_AUTH_SECRET names the missing secret."""
    with pytest.raises(ConfigurationError) as info:
        AgentSettings.from_env({"CONDUCTOR_AUTH_KEY": "key-id-1"})
    assert "CONDUCTOR_AUTH_SECRET" == info.value.variable
    assert "CONDUCTOR_AUTH_SECRET" in str(info.value)


def test_secret_without_key_is_an_error_that_hides_the_secret():
    """CONDUCTOR_AUTH_SECRET without a key names the key and never echoes the secret."""
    with pytest.raises(ConfigurationError) as info:
        AgentSettings.from_env({"CONDUCTOR_AUTH_SECRET": SECRET})
    assert "CONDUCTOR_AUTH_KEY" == info.value.variable
    assert SECRET not in str(info.value)
    assert SECRET not in repr(info.value)


def test_secret_is_never_in_repr():
    """repr and str of settings holding a secret show neither the secret nor the key."""
    settings = AgentSettings.from_env({"CONDUCTOR_AUTH_KEY": "key-id-1", "CONDUCTOR_AUTH_SECRET": SECRET})
    assert SECRET not in repr(settings)
    assert SECRET not in str(settings)
    assert SECRET == settings.auth_secret
    assert True is settings.has_auth


def test_no_auth_by_default():
    """Settings without a key need no token."""
    assert False is AgentSettings().has_auth


@pytest.mark.parametrize("field,value", [
    ("server_url", "not a url"),
    ("server_url", None),
    ("worker_threads", 0),
    ("worker_threads", True),
    ("worker_threads", "8"),
    ("liveness_enabled", "yes"),
    ("auto_start_workers", 1),
    ("status_poll_interval_seconds", 0),
    ("wait_timeout_seconds", -1.0),
    ("liveness_stall_seconds", float("nan")),
])
def test_bad_explicit_value_names_the_field(field, value):
    """A bad explicit argument raises ConfigurationError whose .variable names the field."""
    with pytest.raises(ConfigurationError) as info:
        AgentSettings(**{field: value})
    assert field == info.value.variable
    assert field in str(info.value)


@pytest.mark.parametrize("field,value", [
    ("max_transient_errors", -1),
    ("worker_threads", 2.5),
    ("worker_poll_interval_ms", 0.5),
    ("mailbox_check_seconds", 0),
    ("mailbox_check_seconds", 1.5),
    ("mailbox_check_max_seconds", 0),
])
def test_bad_explicit_count_is_a_configuration_error(field, value):
    """A negative or fractional count raises ConfigurationError naming the field, like every other setting."""
    with pytest.raises(ConfigurationError) as info:
        AgentSettings(**{field: value})
    assert field == info.value.variable


def test_evolve_validates_too():
    """attrs.evolve re-runs the validators."""
    with pytest.raises(ConfigurationError):
        attrs.evolve(AgentSettings(), liveness_check_interval_seconds=0)


@pytest.mark.parametrize("stall, long_poll_ms, ok", [
    (1.0, 1000, True), (0.5, 1000, False), (2.0, 3000, False), (3.0, 3000, True), (30.0, 5000, True),
])
def test_a_stall_threshold_shorter_than_the_sdks_own_pauses_is_refused(stall, long_poll_ms, ok):
    """Issue 19: a threshold a live poller can exceed by itself (one long poll, or under 1 s) would
    report live workers as stalled: ConfigurationError naming the variable."""
    from conductor_agents.errors import ConfigurationError

    if ok:
        assert AgentSettings(liveness_stall_seconds=stall, worker_long_poll_ms=long_poll_ms)
        return
    with pytest.raises(ConfigurationError) as info:
        AgentSettings(liveness_stall_seconds=stall, worker_long_poll_ms=long_poll_ms)
    assert info.value.variable == "CONDUCTOR_AGENT_LIVENESS_STALL_SECONDS" and "at least" in str(info.value)
    if long_poll_ms == 1000:  # the default long poll: the variable alone is refused too
        with pytest.raises(ConfigurationError):
            AgentSettings.from_env(environ={"CONDUCTOR_AGENT_LIVENESS_STALL_SECONDS": str(stall)})


def test_keep_runs_all_keeps_every_run_and_reaches_the_continuation():
    """``CONDUCTOR_AGENT_KEEP_RUNS=all`` keeps every run of a listener (audit); a number is handed to the
    continuation of agents that have none of their own."""
    from conductor_agents import Agent, Continuation

    keep_all = AgentSettings.from_env({"CONDUCTOR_AGENT_KEEP_RUNS": "all"})
    assert keep_all.keep_runs is None
    agent = Agent("a", "openai/gpt-4o-mini", instructions="x")
    assert keep_all.continuation_for(agent).keep_runs is None
    assert AgentSettings.from_env({}).continuation_for(agent).keep_runs == 2
    assert AgentSettings.from_env({"CONDUCTOR_AGENT_KEEP_RUNS": "0"}).continuation_for(agent).keep_runs == 0
    own = Agent("b", "openai/gpt-4o-mini", instructions="x", continuation=Continuation(keep_runs=7))
    assert keep_all.continuation_for(own).keep_runs == 7


@pytest.mark.parametrize("raw,expected", [
    ("12h", timedelta(hours=12)), ("45m", timedelta(minutes=45)), ("90s", timedelta(seconds=90)),
    ("3600", timedelta(hours=1)), (" 1.5d ", timedelta(hours=36)), ("none", None),
])
def test_keep_for_takes_a_duration_and_reaches_the_continuation(raw, expected):
    """``CONDUCTOR_AGENT_KEEP_FOR`` is a duration (d/h/m/s, or seconds); ``none`` sets no age limit. It
    reaches the continuation of an agent without its own, beside ``keep_runs``."""
    from conductor_agents import Agent

    settings = AgentSettings.from_env({"CONDUCTOR_AGENT_KEEP_FOR": raw})
    assert settings.keep_for == expected
    agent = Agent("a", "openai/gpt-4o-mini", instructions="x")
    assert (settings.continuation_for(agent).keep_for, settings.continuation_for(agent).keep_runs) == (expected, 2)
    with pytest.raises(ConfigurationError, match="keep_for"):
        AgentSettings(keep_for=5)


@pytest.mark.parametrize("name, raw, expected", [
    ("CONDUCTOR_AGENT_WORKER_THREADS", "x", "expected a whole number >= 1"),
    ("CONDUCTOR_AGENT_WORKER_THREADS", "2.5", "expected a whole number >= 1"),
    ("CONDUCTOR_AGENT_WORKER_THREADS", "0", "expected a whole number >= 1"),
    ("CONDUCTOR_AGENT_WORKER_POLL_INTERVAL", "fast", "expected a whole number >= 1"),
    ("CONDUCTOR_AGENT_CONTINUE_AFTER_TURNS", "many", "expected a whole number >= 2"),
    ("CONDUCTOR_AGENT_CONTINUE_AFTER_BYTES", "1MB", "expected a whole number >= 100000"),
    ("CONDUCTOR_AGENT_KEEP_RUNS", "some", "expected a whole number >= 0, or 'all' to keep every run"),
    ("CONDUCTOR_AGENT_MAILBOX_CHECK_SECONDS", "30s", "expected a whole number >= 1"),
    ("CONDUCTOR_AGENT_LIVENESS_STALL_SECONDS", "soon", "expected a number > 0"),
])
def test_a_value_that_is_not_a_number_says_what_is_expected(name, raw, expected):
    """Not Python's ``invalid literal for int() with base 10: 'x'`` (issue 41, point 6): what the variable takes."""
    with pytest.raises(ConfigurationError) as info:
        AgentSettings.from_env({name: raw})
    assert str(info.value) == f"environment variable {name}={raw!r} is invalid: {expected}"
