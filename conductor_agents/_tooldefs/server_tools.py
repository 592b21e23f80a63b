"""Tools the server runs itself, with no worker: :class:`HttpTool`, :class:`McpTool` and :class:`ApiTool`.

Re-exported by :mod:`conductor_agents.tools`. Like :class:`WaitForMessageTool` they are values
(``ToolDef`` of a server-side type) built by a ``create`` function.

Secrets never pass through this process: a header value may hold ``${NAME}`` placeholders, which
the server replaces with its secret ``NAME`` when it sends the request (on Conductor OSS, the
server's environment variable ``CONDUCTOR_SECRET_NAME``); the run's stored task input keeps the
placeholder, not the value (verified on the 3.32.3 server). A header that carries credentials by
its name (``Authorization``, ``Cookie``, anything with ``key``, ``token``, ``secret`` or ``auth``)
must use a placeholder: a literal value there is refused, and error messages never repeat a
header's value.

Pure values and functions; thread-safe.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Iterable, Mapping
from typing import Any

from .._common.checks import Refusal, an_int
from ..errors import ToolDefinitionError
from .tooldef import API, HTTP, MCP, ToolDef

__all__ = ["ApiTool", "HttpTool", "McpTool"]

#: ``${NAME}``: a secret the server puts in a header value when it sends the request.
_PLACEHOLDER = re.compile(r"\$\{([^}]*)\}")
_SECRET_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
#: Header names that carry credentials: their value must be a placeholder, never a literal.
_SENSITIVE = re.compile(r"authorization|cookie|key|token|secret|auth|password", re.IGNORECASE)
_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS")


def _check_url(tool: str, url: Any, what: str = "url") -> str:
    if not isinstance(url, str):
        raise ToolDefinitionError(f"tool {tool!r}: {what} must be a str, got {type(url).__name__}")
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ToolDefinitionError(f"tool {tool!r}: {what} must be an http:// or https:// URL, got {url!r}")
    if parts.username or parts.password:
        raise ToolDefinitionError(
            f"tool {tool!r}: {what} must not carry credentials; use a header with a ${{NAME}} placeholder")
    return url


def _check_headers(tool: str, headers: Mapping[str, Any] | None) -> dict[str, str]:
    """The headers as a dict of strings; every placeholder names a secret; credentials only as placeholders.

    Raises:
        ToolDefinitionError: a bad name or value (the message names the header, never its value).
    """
    if headers is None:
        return {}
    if not isinstance(headers, Mapping):
        raise ToolDefinitionError(f"tool {tool!r}: headers must be a mapping, got {type(headers).__name__}")
    checked: dict[str, str] = {}
    for name, value in headers.items():
        if not isinstance(name, str) or not _HEADER_NAME.fullmatch(name):
            raise ToolDefinitionError(f"tool {tool!r}: {name!r} is not a valid header name")
        if not isinstance(value, str):
            raise ToolDefinitionError(f"tool {tool!r}: header {name!r} must have a str value")
        names = _PLACEHOLDER.findall(value)
        for secret in names:
            if not _SECRET_NAME.fullmatch(secret):
                raise ToolDefinitionError(
                    f"tool {tool!r}: header {name!r} has a placeholder that names no secret (write "
                    "${NAME}: letters, digits and '_', starting with a letter or '_')")
        if _SENSITIVE.search(name) and not names:
            raise ToolDefinitionError(
                f"tool {tool!r}: header {name!r} carries credentials but holds a literal value; keep the "
                f"secret on the server and write a placeholder, e.g. {{{name!r}: 'Bearer ${{MY_TOKEN}}'}}")
        checked[name] = value
    return checked


def _names(tool: str, value: Iterable[str] | None, what: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, (str, bytes)) or not all(isinstance(v, str) and v for v in value):
        raise ToolDefinitionError(f"tool {tool!r}: {what} must be a list of argument names")
    return list(value)


def secret_names(tool: ToolDef) -> tuple[str, ...]:
    """The secrets a server-side tool's headers name (its ``${NAME}`` placeholders), in order."""
    headers = tool.config.get("headers") or {}
    found: list[str] = []
    for value in headers.values():
        for name in _PLACEHOLDER.findall(str(value)):
            if name not in found:
                found.append(name)
    return tuple(found)


class HttpTool:
    """A tool the server runs as an HTTP request (a Conductor ``HTTP`` task). Stateless; thread-safe."""

    @staticmethod
    def create(
        *,
        name: str,
        url: str,
        description: str = "",
        method: str = "GET",
        input_schema: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        path_template: str | None = None,
        query_params: Iterable[str] | None = None,
        accept: str = "application/json",
        content_type: str = "application/json",
    ) -> ToolDef:
        """An ``http`` ToolDef: the model's arguments become the request, the response its result.

        How the server builds the request (3.32.3): for ``GET``, ``HEAD``, ``DELETE`` and
        ``OPTIONS`` every argument goes into the query string (those of ``path_template`` too,
        unless ``query_params`` lists which); for the other methods the arguments are the JSON
        body. ``path_template`` (e.g. ``"/items/{sku}"``) is appended to ``url`` with those
        arguments filled in (URL-encoded; they leave the body) and ``query_params`` names the
        arguments sent in the query string instead of the body. The model sees
        ``{"response": {"statusCode", "headers", "body", "reasonPhrase"}}``.

        Raises:
            ToolDefinitionError: a bad name, URL, method, header (see the module docstring) or schema.
        """
        _check_url(name, url)
        if not isinstance(method, str) or method.upper() not in _METHODS:
            raise ToolDefinitionError(f"tool {name!r}: method must be one of {_METHODS}, got {method!r}")
        config: dict[str, Any] = {"url": url, "method": method.upper(), "accept": accept,
                                  "contentType": content_type}
        checked = _check_headers(name, headers)
        if checked:
            config["headers"] = checked
        if path_template is not None:
            if not isinstance(path_template, str) or not path_template.startswith("/"):
                raise ToolDefinitionError(f"tool {name!r}: path_template must be a str starting with '/'")
            config["pathTemplate"] = path_template
        params = _names(name, query_params, "query_params")
        if params:
            config["queryParams"] = params
        return ToolDef(
            name=name,
            description=description,
            input_schema=dict(input_schema) if input_schema is not None else {"type": "object", "properties": {}},
            tool_type=HTTP,
            config=config,
        )


def _discovered(kind: str, url_key: str, url: str, name: str, description: str,
                headers: Mapping[str, str] | None, max_tools: int | None) -> ToolDef:
    """A ToolDef of a server-side type whose tools the server discovers at the start of each run."""
    _check_url(name, url, url_key)
    config: dict[str, Any] = {url_key: url}
    checked = _check_headers(name, headers)
    if checked:
        config["headers"] = checked
    if max_tools is not None:
        refusal = Refusal(ToolDefinitionError, prefix=f"tool {name!r}: ")
        config["max_tools"] = an_int(at_least=1, refusal=refusal).check("max_tools", max_tools)
    return ToolDef(name=name, description=description, input_schema={"type": "object", "properties": {}},
                   tool_type=kind, config=config)


class ApiTool:
    """The operations of an OpenAPI (3, or Swagger 2, or a Postman collection) service, called by the server.

    At the start of each run the server reads the spec (``LIST_API_TOOLS``), offers each operation
    to the model under its ``operationId`` and runs a call as an ``HTTP`` request to the spec's
    server URL; ``headers`` (``${NAME}`` placeholders allowed) go with the spec read and every call.
    ``name`` only labels this entry. Stateless; thread-safe.
    """

    @staticmethod
    def create(*, spec_url: str, name: str = "api", description: str = "",
               headers: Mapping[str, str] | None = None, max_tools: int | None = None) -> ToolDef:
        """An ``api`` ToolDef for the service whose spec is at ``spec_url``.

        Raises:
            ToolDefinitionError: a bad URL, header (see the module docstring) or ``max_tools``.
        """
        return _discovered(API, "url", spec_url, name, description or f"Operations of the API at {spec_url}",
                           headers, max_tools)


class McpTool:
    """The tools of a Model Context Protocol server, which the server calls itself. Stateless; thread-safe.

    At the start of each run the server lists the MCP server's tools (``LIST_MCP_TOOLS``) and
    offers them to the model under their own names; a call runs as ``CALL_MCP_TOOL``. ``name``
    only labels this entry in the agent (it must differ from every tool name). The MCP server
    must speak the Streamable HTTP transport.
    """

    @staticmethod
    def create(
        *,
        server_url: str,
        name: str = "mcp",
        description: str = "",
        headers: Mapping[str, str] | None = None,
        max_tools: int | None = None,
    ) -> ToolDef:
        """An ``mcp`` ToolDef for the MCP server at ``server_url``.

        ``max_tools``: past this many discovered tools the server has the model pick the relevant
        ones first (the server's default is 32).

        Raises:
            ToolDefinitionError: a bad URL, header (see the module docstring) or ``max_tools``.
        """
        return _discovered(MCP, "server_url", server_url, name,
                           description or f"Tools of the MCP server at {server_url}", headers, max_tools)
