"""How a Conductor node is started: the options :class:`~conductor_agents.LocalServer` and
:class:`~conductor_agents.local_server.LocalCluster` share, checked once.

Both constructors keep their keyword arguments (``version``, ``jar``, ``java``, ``env``, ``properties``,
``jvm_options``, ``startup_timeout``, ``stop_timeout``, ``detached``, ``progress``, ``secrets``) and build
one :class:`NodeOptions` from them; a cluster hands the same value to each of its nodes
(:meth:`NodeOptions.as_kwargs`), so its arguments are checked when it is made, not when a node is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from ..errors import ConfigurationError
from ._command import DEFAULT_JVM_OPTIONS
from ._jar import PathLike
from ._java import JavaRuntime

__all__ = ["NodeOptions", "secret_environment"]

#: Properties set through their own argument (``port=``), never through ``properties``.
_RESERVED_PROPERTIES = frozenset({"server.port"})


def _positive(name: str, value: Any) -> float:
    if not value > 0:
        raise ConfigurationError(f"{name} must be positive, got {value!r}")
    return float(value)


def _startup_seconds(value: Any) -> float:
    return _positive("startup_timeout", value)


def _stop_seconds(value: Any) -> float:
    return _positive("stop_timeout", value)


def _environment(env: Mapping[str, str] | None) -> dict[str, str]:
    if any(not isinstance(k, str) or not isinstance(v, str) for k, v in (env or {}).items()):
        raise ConfigurationError("env must map str to str")
    return dict(env or {})


def _properties(properties: Mapping[str, object] | None) -> dict[str, str]:
    reserved = _RESERVED_PROPERTIES.intersection(properties or {})
    if reserved:
        raise ConfigurationError(f"set the port with port=, not with properties {sorted(reserved)}")
    return {str(k): str(v) for k, v in (properties or {}).items()}


def _jvm_options(options: Sequence[str] | None) -> tuple[str, ...]:
    return tuple(DEFAULT_JVM_OPTIONS if options is None else options)


def _secrets(secrets: Mapping[str, str] | None) -> dict[str, str]:
    secret_environment(secrets)  # checks them
    return dict(secrets or {})


def _optional_path(value: PathLike | None) -> Path | None:
    return Path(value) if value is not None else None


@attrs.frozen
class NodeOptions:
    """What a node runs (``version``, ``jar``, ``java``), with what (``env``, ``properties``, ``jvm_options``,
    ``secrets``), how long it may take (``startup_timeout``, ``stop_timeout``) and how it is attached
    (``detached``, ``progress``), as :class:`~conductor_agents.LocalServer` documents them. Immutable.

    Raises:
        ConfigurationError: an option has a bad value (the message names it; never a secret's value).
    """

    version: str | None = None
    jar: Path | None = attrs.field(default=None, converter=_optional_path)
    java: JavaRuntime | PathLike | None = None
    env: dict[str, str] = attrs.field(factory=dict, converter=_environment, repr=False)  # may hold API keys
    properties: dict[str, str] = attrs.field(factory=dict, converter=_properties)
    jvm_options: tuple[str, ...] = attrs.field(default=None, converter=_jvm_options)
    startup_timeout: float = attrs.field(default=180.0, converter=_startup_seconds)
    stop_timeout: float = attrs.field(default=20.0, converter=_stop_seconds)
    detached: bool = False
    progress: bool = True
    secrets: dict[str, str] = attrs.field(factory=dict, converter=_secrets, repr=False)

    @property
    def secret_env(self) -> dict[str, str]:
        """The secrets as the server's environment (its env-backed secrets store)."""
        return secret_environment(self.secrets)

    def as_kwargs(self) -> dict[str, Any]:
        """These options as the keyword arguments of :class:`~conductor_agents.LocalServer`."""
        return attrs.asdict(self, recurse=False)


def secret_environment(secrets: Mapping[str, str] | None) -> dict[str, str]:
    """``secrets`` as the server's environment (its env-backed secrets store).

    Raises:
        ConfigurationError: a name is not a secret name or a value is not a non-empty str (the
            message names the secret, never its value).
    """
    from .._common.secrets import SECRET_ENV_PREFIX, check_credential_names

    out: dict[str, str] = {}
    for name, value in (secrets or {}).items():
        check_credential_names([name], what="secrets", error=ConfigurationError)
        if not isinstance(value, str) or not value:
            raise ConfigurationError(f"secret {name!r} must have a non-empty str value", variable=name)
        out[f"{SECRET_ENV_PREFIX}{name}"] = value
    return out
