"""Telling a server URL that misses the API prefix (``http://host:8080`` for ``http://host:8080/api``).

The Conductor server serves its UI and static files at the root and the API under ``/api``. A
base URL without the prefix reaches the server, so nothing fails to connect: ``POST /agent/start``
answers 404 ``No static resource agent/start.`` and a ``GET`` may answer the UI's HTML page. Both
are read here as the one configuration mistake they are, but only when the URL does not already end
in ``/api`` (there a 404 is a missing endpoint, which callers handle).
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

from ..errors import ConfigurationError

__all__ = ["api_url", "missing_api_prefix"]

_SPRING_NO_ROUTE = "No static resource"
_VERSION = re.compile(r"v\d+", re.IGNORECASE)


def missing_api_prefix(base_url: str, method: str, path: str, *, status: int, server_message: str = "",
                       content_type: str = "") -> ConfigurationError | None:
    """The error to raise when this answer means ``base_url`` lacks the API prefix, else None."""
    if urlsplit(base_url).path.rstrip("/").endswith("/api"):
        return None
    if status == 404 and server_message.startswith(_SPRING_NO_ROUTE):
        answer = f"HTTP 404 {server_message.strip()!r}"
    elif status < 300 and "text/html" in content_type:
        answer = "a web page, not JSON"
    else:
        return None
    return ConfigurationError(
        f"the server URL {base_url} is not the Conductor API ({method} {path} answered {answer}): "
        f"the API is under /api, set CONDUCTOR_SERVER_URL (or --server-url) to {api_url(base_url)}")


def api_url(base_url: str) -> str:
    """The URL of the API that ``base_url`` most likely meant.

    ``/api`` after what ``base_url`` has, except that a version (``/v1``) is dropped first and a path that
    already has ``/api`` (``/api/v1``) is cut back to it: the API is ``/api``, with no version after it.
    """
    parts = urlsplit(base_url)
    segments = [segment for segment in parts.path.split("/") if segment]
    lowered = [segment.lower() for segment in segments]
    if "api" in lowered:
        segments = segments[: len(segments) - lowered[::-1].index("api")]
    else:
        if segments and _VERSION.fullmatch(segments[-1]):
            segments.pop()
        segments.append("api")
    return urlunsplit((parts.scheme, parts.netloc, "/" + "/".join(segments), "", ""))
