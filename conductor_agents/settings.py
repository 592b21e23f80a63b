"""Runtime settings, read from arguments and the environment.

This is the only module that reads ``os.environ`` for the SDK runtime. Precedence:
an explicit argument, then the environment, then the default. A malformed value is a
:class:`~conductor_agents.errors.ConfigurationError` that names the variable; the SDK
never silently falls back to a default when a value is present but wrong.
"""

from __future__ import annotations

import difflib
import os
import re
import warnings
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any
from urllib.parse import urlparse

import attrs

from ._common.checks import Refusal, a_bool, a_number, an_int, optional
from .continuation import DEFAULT_KEEP_RUNS, DEFAULT_MAX_BYTES, DEFAULT_MAX_TURNS, Continuation
from .errors import ConfigurationError

__all__ = ["AgentSettings", "ENV_VARS", "OTHER_KNOWN_VARS", "unknown_variables"]

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _parse_bool(raw: str) -> bool:
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError("expected one of true/false, 1/0, yes/no, on/off")


def _whole_number(raw: str, minimum: int, *, also: str = "") -> int:
    """``raw`` as a whole number >= ``minimum``; ``also`` names what else the variable takes, for the message."""
    expected = ValueError(f"expected a whole number >= {minimum}{also}")  # from_env shows the value itself
    try:
        value = int(raw.strip())
    except ValueError:
        raise expected from None
    if value < minimum:
        raise expected
    return value


def _parse_positive_int(raw: str) -> int:
    return _whole_number(raw, 1)


def _parse_int_at_least(minimum: int) -> Callable[[str], int]:
    def parse(raw: str) -> int:
        return _whole_number(raw, minimum)

    return parse


def _parse_keep_runs(raw: str) -> int | None:
    if raw.strip().lower() in ("all", "none"):
        return None  # keep every run
    return _whole_number(raw, 0, also=", or 'all' to keep every run")


_DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhd]?)$")
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def _parse_duration(raw: str) -> timedelta | None:
    text = raw.strip().lower()
    if text in ("", "none"):
        return None  # no age limit
    match = _DURATION.match(text)
    if match is None or float(match.group(1)) <= 0:
        raise ValueError("expected a duration > 0 such as 30d, 12h, 45m, 90s or a number of seconds ('none': no "
                         "age limit)")
    return timedelta(seconds=float(match.group(1)) * _UNIT_SECONDS[match.group(2)])


def _parse_positive_float(raw: str) -> float:
    expected = ValueError("expected a number > 0")
    try:
        value = float(raw.strip())
    except ValueError:
        raise expected from None
    if not value > 0 or value == float("inf"):  # NaN is not > 0
        raise expected
    return value


def _parse_url(raw: str) -> str:
    return _check_url(raw.strip())


def _check_url(value: str) -> str:
    parsed = urlparse(value)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ValueError("expected an http(s) URL such as http://localhost:8080/api")
    return value.rstrip("/")


def _parse_str(raw: str) -> str:
    return raw


#: What a listener waits in (``listener_wait``): the server's wait for messages, or a ``HUMAN`` task.
LISTENER_WAITS = ("pull", "human")


def _parse_listener_wait(raw: str) -> str:
    value = raw.strip().lower()
    if value not in LISTENER_WAITS:
        raise ValueError(f"expected one of {', '.join(LISTENER_WAITS)}")
    return value


#: Environment variable -> (settings field, parser). The README's configuration table mirrors it.
ENV_VARS: Mapping[str, tuple[str, Callable[[str], Any]]] = {
    "CONDUCTOR_SERVER_URL": ("server_url", _parse_url),
    "CONDUCTOR_AUTH_KEY": ("auth_key", _parse_str),
    "CONDUCTOR_AUTH_SECRET": ("auth_secret", _parse_str),
    "CONDUCTOR_AGENT_WORKER_THREADS": ("worker_threads", _parse_positive_int),
    "CONDUCTOR_AGENT_WORKER_POLL_INTERVAL": ("worker_poll_interval_ms", _parse_positive_int),
    "CONDUCTOR_AGENT_AUTO_START_WORKERS": ("auto_start_workers", _parse_bool),
    "CONDUCTOR_AGENT_LIVENESS_ENABLED": ("liveness_enabled", _parse_bool),
    "CONDUCTOR_AGENT_LIVENESS_CHECK_INTERVAL_SECONDS": (
        "liveness_check_interval_seconds",
        _parse_positive_float,
    ),
    "CONDUCTOR_AGENT_LIVENESS_STALL_SECONDS": ("liveness_stall_seconds", _parse_positive_float),
    "CONDUCTOR_AGENT_CONTINUATION_ENABLED": ("continuation_enabled", _parse_bool),
    "CONDUCTOR_AGENT_CONTINUE_AFTER_TURNS": ("continue_after_turns", _parse_int_at_least(2)),
    "CONDUCTOR_AGENT_CONTINUE_AFTER_BYTES": ("continue_after_bytes", _parse_int_at_least(100_000)),
    "CONDUCTOR_AGENT_KEEP_RUNS": ("keep_runs", _parse_keep_runs),
    "CONDUCTOR_AGENT_KEEP_FOR": ("keep_for", _parse_duration),
    "CONDUCTOR_AGENT_PENDING_CHECK_INTERVAL_SECONDS": ("pending_check_interval_seconds", _parse_positive_float),
    "CONDUCTOR_AGENT_MAILBOX_CHECK_SECONDS": ("mailbox_check_seconds", _parse_positive_int),
    "CONDUCTOR_AGENT_MAILBOX_CHECK_MAX_SECONDS": ("mailbox_check_max_seconds", _parse_positive_int),
    "CONDUCTOR_AGENT_LISTENER_WAIT": ("listener_wait", _parse_listener_wait),
}


#: Variables of the ``CONDUCTOR_AGENT_`` / ``CONDUCTOR_AGENTS_`` families that are not runtime
#: settings but are read elsewhere (the local server, the test plugin, the samples): known, so
#: never reported as typos.
OTHER_KNOWN_VARS = frozenset({
    "CONDUCTOR_AGENT_MODEL",
    "CONDUCTOR_AGENTS_CACHE_DIR",
    "CONDUCTOR_AGENTS_STATE_DIR",
    "CONDUCTOR_AGENTS_MAVEN_REPOSITORY",
    "CONDUCTOR_AGENTS_BOOT_ARCHIVE",
    "CONDUCTOR_AGENTS_TEST_SERVER_URL",
    "CONDUCTOR_AGENTS_TEST_LLM_PORT",
    "CONDUCTOR_AGENTS_TEST_SECRET",
})
_OWN_PREFIXES = ("CONDUCTOR_AGENT_", "CONDUCTOR_AGENTS_")


def unknown_variables(environ: Mapping[str, str]) -> list[tuple[str, str]]:
    """``(variable, closest known variable)`` for each ``CONDUCTOR_AGENT(S)_*`` name nobody reads."""
    known = sorted(set(ENV_VARS) | OTHER_KNOWN_VARS)
    found = []
    for name in sorted(environ):
        if not name.startswith(_OWN_PREFIXES) or name in known:
            continue
        closest = difflib.get_close_matches(name, known, n=1, cutoff=0.0)
        found.append((name, closest[0] if closest else known[0]))
    return found


def _warn_unknown(environ: Mapping[str, str]) -> None:
    # warnings.warn rather than a log record: it shows on stderr even where logging is not
    # configured, once per message (a web app building settings per request is not flooded),
    # and `-W error` / a filter on the message makes a typo fatal in CI or silences it.
    for name, closest in unknown_variables(environ):
        warnings.warn(
            f"environment variable {name} is not a conductor-agents setting and is ignored; "
            f"did you mean {closest}? (see docs/configuration.md)",
            UserWarning,
            stacklevel=3,
        )


#: A setting given a bad value raises ConfigurationError naming it (``variable``).
_SETTING = Refusal(ConfigurationError)
_positive = a_number(above=0, refusal=_SETTING)
_optional_whole = optional(an_int(at_least=0, refusal=_SETTING))
_is_bool = a_bool(refusal=_SETTING)


def _is_listener_wait(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value not in LISTENER_WAITS:
        raise ConfigurationError(f"{attribute.name} must be one of {', '.join(map(repr, LISTENER_WAITS))}, got "
                                 f"{value!r}", variable=attribute.name)


def _optional_duration(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and (not isinstance(value, timedelta) or value <= timedelta(0)):
        raise ConfigurationError(f"{attribute.name} must be a timedelta longer than zero or None, got {value!r}",
                                 variable=attribute.name)


def _valid_url(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    try:
        _check_url(value)
    except (ValueError, AttributeError, TypeError):
        raise ConfigurationError(
            f"{attribute.name} must be an http(s) URL such as http://localhost:8080/api, got {value!r}",
            variable=attribute.name,
        ) from None


def _strip_slash(value: str) -> str:
    return value.rstrip("/") if isinstance(value, str) else value


#: The shortest stall threshold the SDK accepts (and never shorter than one long poll).
MIN_STALL_SECONDS = 1.0


def minimum_stall_seconds(worker_long_poll_ms: int) -> float:
    """The shortest ``liveness_stall_seconds`` that cannot report a live worker as stalled.

    A live poller may spend one long poll (``worker_long_poll_ms``) on another task type before it
    asks for a waiting task, and retries a failed poll after up to half a second when a task waits.
    Its other pauses scale with the threshold: the back-off after failed polls is at most a quarter
    of it (and 5 s), the queue watcher's recheck of an unlisted queue at most half (and 30 s).
    """
    return max(MIN_STALL_SECONDS, worker_long_poll_ms / 1000.0)


@attrs.frozen
class AgentSettings:
    """Connection, worker and liveness settings of an :class:`~conductor_agents.AgentRuntime`.

    Immutable and so safe to share between threads; derive a changed copy with
    ``attrs.evolve(settings, worker_threads=16)``. Secrets are kept out of ``repr``.
    """

    #: Base URL of the Conductor API, e.g. ``http://localhost:8080/api``.
    server_url: str = attrs.field(
        default="http://localhost:8080/api", converter=_strip_slash, validator=_valid_url
    )
    #: Key id for servers that require a token (Orkes). Never logged.
    auth_key: str | None = attrs.field(default=None, repr=False)
    #: Key secret for servers that require a token. Never logged.
    auth_secret: str | None = attrs.field(default=None, repr=False)
    #: Threads that run tool bodies (shared by every run of one runtime).
    worker_threads: int = attrs.field(default=16, validator=an_int(at_least=1, refusal=_SETTING))
    #: Pause between empty polls of one run's task queues, in milliseconds.
    worker_poll_interval_ms: int = attrs.field(default=100, validator=an_int(at_least=1, refusal=_SETTING))
    #: Start tool workers for runs this runtime starts or resumes.
    auto_start_workers: bool = attrs.field(default=True, validator=_is_bool)
    #: Watch stateful runs for tasks no worker polls (see ``WorkerStallError``).
    liveness_enabled: bool = attrs.field(default=True, validator=_is_bool)
    #: How often the liveness monitor samples a run's task list.
    liveness_check_interval_seconds: float = attrs.field(default=10.0, validator=_positive)
    #: How long a domain-routed task may sit unpolled before it counts as a stall.
    liveness_stall_seconds: float = attrs.field(default=30.0, validator=_positive)
    #: How often ``wait()`` polls the run's status.
    status_poll_interval_seconds: float = attrs.field(default=0.5, validator=_positive)
    #: Default overall deadline of ``wait()``.
    wait_timeout_seconds: float = attrs.field(default=600.0, validator=_positive)
    #: Consecutive transient status errors ``wait()`` tolerates (the next one raises).
    max_transient_errors: int = attrs.field(default=3, validator=an_int(at_least=0, refusal=_SETTING))
    #: Connect/read timeout of ordinary HTTP calls, in seconds.
    http_timeout_seconds: float = attrs.field(default=30.0, validator=_positive)
    #: Server-side long-poll time of one worker poll, in milliseconds (the server caps it at 5000).
    worker_long_poll_ms: int = attrs.field(default=1000, validator=an_int(at_least=1, refusal=_SETTING))
    #: How long ``start()``/``resume()`` wait for the server to see their workers polling.
    worker_startup_timeout_seconds: float = attrs.field(default=10.0, validator=_positive)
    #: How long ``close()`` lets running tool bodies finish.
    shutdown_grace_seconds: float = attrs.field(default=10.0, validator=_positive)
    #: Continue long-lived listeners as fresh runs (agents without a ``continuation`` of their own).
    continuation_enabled: bool = attrs.field(default=True, validator=_is_bool)
    #: A listener's run is continued after this many model turns...
    continue_after_turns: int = attrs.field(default=DEFAULT_MAX_TURNS,
                                            validator=an_int(at_least=2, refusal=_SETTING))
    #: ... or once it is estimated to store this many bytes on the server.
    continue_after_bytes: int = attrs.field(default=DEFAULT_MAX_BYTES,
                                            validator=an_int(at_least=100_000, refusal=_SETTING))
    #: Ended runs of a continued listener kept on the server besides its first one; None keeps all.
    keep_runs: int | None = attrs.field(default=DEFAULT_KEEP_RUNS, validator=_optional_whole)
    #: ... and none of them longer than this after it ended (None: no age limit).
    keep_for: timedelta | None = attrs.field(default=None, validator=_optional_duration)
    #: Longest a switch waits, without progress, for the old run to come to rest.
    continuation_drain_seconds: float = attrs.field(default=60.0, validator=_positive)
    #: Longest ``send_message`` waits for a switch its message was caught in to be committed (the
    #: old run first works off what its queue held: a backlog takes a turn per message or batch).
    switch_wait_seconds: float = attrs.field(default=300.0, validator=_positive)
    #: How often the runtime's ``on_pending`` hook samples runs that can wait for a person.
    pending_check_interval_seconds: float = attrs.field(default=5.0, validator=_positive)
    #: How soon (whole seconds) after a listener's last message the serving process has the server look at its
    #: mailbox; the looks then come at gaps that double while the listener stays idle, up to
    #: ``mailbox_check_max_seconds``. A raw ``POST /workflow/{id}/messages`` to
    #: the id callers hold is taken at once, except one that lands within a second of the mailbox's previous round,
    #: which is taken at the next look; each
    #: look costs the server one round of a small run; they also time out a forward whose result was lost (a run
    #: resting in a ``HUMAN`` task leaves the server's sweeps). A mailbox of version 3, opened by an earlier release,
    #: rests in a ``WAIT`` of the value it had.
    mailbox_check_seconds: int = attrs.field(default=30, validator=an_int(at_least=1, refusal=_SETTING))
    #: The longest gap (whole seconds) between two looks at an idle listener's mailbox (at least
    #: ``mailbox_check_seconds``, which a smaller value means): the bound for a raw push caught by a young rest.
    #: 480 cuts an idle fleet's server cost to about a third of looks every 30 s (measured); 30 means those.
    mailbox_check_max_seconds: int = attrs.field(default=480, validator=an_int(at_least=1, refusal=_SETTING))
    #: What a continued listener with a mailbox waits in: ``"human"`` (the default), a ``HUMAN`` task its
    #: mailbox's forward completes, which costs the server nothing while it waits, or ``"pull"``, the server's
    #: wait for messages, evaluated every second (``docs/idle-listeners.md``). A listener keeps the kind it was
    #: started with; a listener without a mailbox or without continuation always waits in ``"pull"``.
    listener_wait: str = attrs.field(default="human", validator=_is_listener_wait)

    def __attrs_post_init__(self) -> None:
        floor = minimum_stall_seconds(self.worker_long_poll_ms)
        if self.liveness_stall_seconds < floor:
            raise ConfigurationError(
                f"liveness_stall_seconds (CONDUCTOR_AGENT_LIVENESS_STALL_SECONDS) is {self.liveness_stall_seconds:g}, "
                f"shorter than the SDK's own pauses between polls: it must be at least {floor:g} s (1 s, and one "
                f"long poll of worker_long_poll_ms={self.worker_long_poll_ms}); a live worker would be reported "
                "stalled", variable="CONDUCTOR_AGENT_LIVENESS_STALL_SECONDS")
        if (self.auth_key is None) != (self.auth_secret is None):
            raise ConfigurationError(
                "CONDUCTOR_AUTH_KEY and CONDUCTOR_AUTH_SECRET must be set together",
                variable="CONDUCTOR_AUTH_KEY" if self.auth_key is None else "CONDUCTOR_AUTH_SECRET",
            )

    def continuation_for(self, agent: Any) -> Continuation:
        """The agent's own :class:`~conductor_agents.Continuation`, or the one these settings give."""
        own: Continuation | None = getattr(agent, "continuation", None)
        if own is not None:
            return own
        if not self.continuation_enabled:
            return Continuation.disabled()
        return Continuation(max_turns=self.continue_after_turns, max_bytes=self.continue_after_bytes,
                            keep_runs=self.keep_runs, keep_for=self.keep_for)

    @property
    def has_auth(self) -> bool:
        """Whether the server wants a token exchanged from a key and secret."""
        return self.auth_key is not None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> AgentSettings:
        """Build settings from ``environ`` (default ``os.environ``); ``overrides`` win.

        A ``CONDUCTOR_AGENT_*`` / ``CONDUCTOR_AGENTS_*`` variable that nothing reads (a typo)
        gives a ``UserWarning`` naming the closest known variable; it is otherwise ignored.

        Raises:
            ConfigurationError: a variable is set to a value that cannot be parsed; the
                message and ``.variable`` name it. Secrets are never echoed.
        """
        env = os.environ if environ is None else environ
        _warn_unknown(env)
        values: dict[str, Any] = {}
        for variable, (field, parse) in ENV_VARS.items():
            raw = env.get(variable)
            if raw is None or raw.strip() == "":
                continue
            try:
                values[field] = parse(raw)
            except ValueError as err:
                shown = "<hidden>" if variable == "CONDUCTOR_AUTH_SECRET" else repr(raw)
                raise ConfigurationError(
                    f"environment variable {variable}={shown} is invalid: {err}", variable=variable
                ) from None
        values.update(overrides)
        return cls(**values)
