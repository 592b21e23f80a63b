"""Test configuration: the project's own pytest plugin gives every test the real server."""

pytest_plugins = ["conductor_agents.testing.pytest_plugin"]
