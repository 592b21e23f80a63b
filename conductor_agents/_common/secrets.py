"""Secrets a tool receives from the server: credential names, the values of one task, redaction.

An agent (``Agent(credentials=[...])``) or a tool (``@tool(credentials=[...])``) names the secrets
its tools need; the server registers those names on each tool's task definition
(``runtimeMetadata``: a tool's own list, else the agent's) and, every time a worker polls a task,
resolves them from its secrets store into the polled task's ``runtimeMetadata`` (on Conductor OSS
the store is the server's environment: ``CONDUCTOR_SECRET_<NAME>``). The values exist only on the
wire and in this process's memory: the server stores neither, and this SDK keeps them out of every
``repr``, log line and error message, and scrubs them from the failure texts it posts.

Pure values and functions; thread-safe.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..errors import MissingSecretError

__all__ = ["SECRET_ENV_PREFIX", "SecretValues", "check_credential_names", "redact"]

#: The prefix under which a Conductor OSS server reads secrets from its environment.
SECRET_ENV_PREFIX = "CONDUCTOR_SECRET_"  # noqa: S105 - a variable-name prefix, not a secret
#: A credential name: what the server's environment-backed store can hold.
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
#: Values shorter than this are not scrubbed from texts (they would mangle ordinary words).
_MIN_REDACTED_LENGTH = 4


def check_credential_names(value: Any, *, what: str, error: Callable[[str], Exception]) -> tuple[str, ...]:
    """``value`` (names of secrets) as a tuple of unique names, in order.

    Raises:
        ``error``: ``value`` is a string, not iterable, or holds a bad name (``what`` names the field).
    """
    if value is None:
        return ()
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise error(f"{what} must be a list of secret names, got {value!r}")
    names: list[str] = []
    for name in value:
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise error(f"{what}: {name!r} is not a secret name (letters, digits and '_', starting with a "
                        "letter or '_', at most 128 characters)")
        if name not in names:
            names.append(name)
    return tuple(names)


class SecretValues:
    """The secrets the server delivered with one task, and the names its definition declares.

    ``repr`` shows the names only. Immutable; thread-safe.
    """

    __slots__ = ("_declared", "_values")

    def __init__(self, values: Mapping[str, Any] | None = None, declared: Iterable[str] = ()) -> None:
        self._values = {str(k): str(v) for k, v in (values or {}).items() if v is not None}
        self._declared = tuple(dict.fromkeys([*declared, *self._values]))

    @classmethod
    def of_task(cls, task: Mapping[str, Any]) -> SecretValues:
        """The secrets of a polled task (its ``runtimeMetadata``, its definition's declared names)."""
        delivered = task.get("runtimeMetadata")
        definition = task.get("taskDefinition")
        declared = definition.get("runtimeMetadata") if isinstance(definition, Mapping) else None
        return cls(delivered if isinstance(delivered, Mapping) else None,
                   [str(n) for n in declared] if isinstance(declared, list) else ())

    @property
    def names(self) -> tuple[str, ...]:
        """The names of the secrets delivered."""
        return tuple(self._values)

    def get(self, name: str, *, tool_name: str = "") -> str:
        """The value of secret ``name``.

        Raises:
            MissingSecretError: the server delivered no such secret with this task (the message
                says whether the name is declared and what to do).
        """
        value = self._values.get(name)
        if value is not None:
            return value
        if name in self._declared:
            raise MissingSecretError(
                f"secret {name!r} is declared for tool {tool_name!r} but the server has no value for it: "
                f"store it in the server's secrets (Conductor OSS: set {SECRET_ENV_PREFIX}{name} in the "
                "server's environment and restart it)",
                name=name, tool_name=tool_name, declared=True)
        raise MissingSecretError(
            f"secret {name!r} is not declared for tool {tool_name!r}: add it to the tool's "
            f"@tool(credentials=[...]) or the agent's Agent(credentials=[...])",
            name=name, tool_name=tool_name, declared=False)

    def redact(self, text: str) -> str:
        """``text`` with every delivered value replaced by ``[secret NAME]``."""
        return redact(text, self._values)

    def __bool__(self) -> bool:
        return bool(self._values)

    def __repr__(self) -> str:
        return f"SecretValues({list(self._values)!r})"


def redact(text: str, values: Mapping[str, str]) -> str:
    """``text`` with each value of ``values`` (name -> value) replaced by ``[secret NAME]``.

    Longer values first, so a value that contains another is replaced whole. Values shorter than
    four characters are left alone.
    """
    if not values or not isinstance(text, str):
        return text
    for name, value in sorted(values.items(), key=lambda item: -len(item[1])):
        if len(value) >= _MIN_REDACTED_LENGTH and value in text:
            text = text.replace(value, f"[secret {name}]")
    return text
