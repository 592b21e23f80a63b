"""How a Conductor node is started: the options :class:`~conductor_agents.LocalServer` and
:class:`~conductor_agents.local_server.LocalCluster` share, checked once.

Both constructors keep their keyword arguments (``version``, ``jar``, ``java``, ``env``, ``properties``,
``jvm_options``, ``startup_timeout``, ``stop_timeout``, ``detached``, ``progress``, ``secrets``) and build
one :class:`NodeOptions` from them. A cluster builds its value when it is made, so its arguments are
checked then, not when a node starts; it makes each node with that value's arguments
(:meth:`NodeOptions.as_kwargs`), which the node builds into a value of its own again (checked values: they
pass).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from .._common.checks import Refusal, a_number
from ..errors import ConfigurationError
from ._command import DEFAULT_JVM_OPTIONS
from ._jar import PathLike
from ._java import JavaRuntime

__all__ = ["NodeOptions", "secret_environment"]

#: Properties set through their own argument (``port=``), never through ``properties``.
_RESERVED_PROPERTIES = frozenset({"server.port"})


#: A number of seconds > 0; a ConfigurationError naming the option otherwise.
_SECONDS = a_number(above=0, real=True, refusal=Refusal(ConfigurationError))


def _startup_seconds(value: Any) -> float:
    return float(_SECONDS.check("startup_timeout", value))


def _stop_seconds(value: Any) -> float:
    return float(_SECONDS.check("stop_timeout", value))


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
    return dict(secrets or {})  # checked once, by secret_env


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
    #: The secrets as the server's environment (its env-backed secrets store): checked and built once, here.
    secret_env: dict[str, str] = attrs.field(init=False, repr=False, eq=False)

    @secret_env.default
    def _secret_env(self) -> dict[str, str]:
        return secret_environment(self.secrets)

    def as_kwargs(self) -> dict[str, Any]:
        """These options as the keyword arguments of :class:`~conductor_agents.LocalServer`."""
        return attrs.asdict(self, recurse=False, filter=lambda attribute, value: attribute.init)


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
