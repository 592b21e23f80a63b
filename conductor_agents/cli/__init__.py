"""The ``conductor-agents`` command line (also ``python -m conductor_agents``)."""

from ._main import main

__all__ = ["main"]
