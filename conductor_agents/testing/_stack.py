"""``LocalStack``: a real Conductor server on this machine wired to a :class:`ScriptedLLM`.

For demos, notebooks and tests that want the whole thing offline in one ``with``
block; the pytest fixtures build the same pair.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from ..settings import AgentSettings
from ._scripted_llm import ScriptedLLM

__all__ = ["LocalStack"]

log = logging.getLogger("conductor_agents.testing")


class LocalStack:
    """A :class:`~conductor_agents.LocalServer` whose OpenAI provider is a :class:`ScriptedLLM`.

    ``with LocalStack() as stack:`` starts both (the server takes ~15 s; the jar is
    downloaded once) and stops both on exit. ``stack.llm.script(...)`` gives the model
    string for an agent; ``stack.settings`` points an :class:`~conductor_agents.AgentRuntime`
    at the server. Not thread-safe to start/stop; the parts themselves are.
    """

    def __init__(self, data_dir: str | Path | None = None, *, port: int | None = None,
                 **server_options: Any) -> None:
        self.llm = ScriptedLLM()
        self._data_dir = data_dir
        self._port = port
        self._server_options = server_options
        self.server: Any = None

    @property
    def url(self) -> str:
        """The server's API base URL (``http://127.0.0.1:PORT/api``)."""
        if self.server is None:
            raise RuntimeError("the stack is not started")
        return str(self.server.url)

    @property
    def settings(self) -> AgentSettings:
        """Runtime settings for this stack's server (other values from the environment)."""
        return AgentSettings.from_env(server_url=self.url)

    def start(self) -> LocalStack:
        """Start the scripted model, then the server. Raises LocalServerError on failure."""
        from ..local_server import LocalServer

        self.llm.start()
        try:
            self.server = LocalServer(self._data_dir, port=self._port, env=self.llm.server_env(),
                                      **self._server_options)
            self.server.start()
        except BaseException:
            self.llm.stop()
            raise
        log.info("local stack up: server %s, scripted model %s", self.server.url, self.llm.base_url)
        return self

    def stop(self) -> None:
        """Stop the server, then the model. Idempotent."""
        try:
            if self.server is not None:
                self.server.stop()
        finally:
            self.llm.stop()

    def __enter__(self) -> LocalStack:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
