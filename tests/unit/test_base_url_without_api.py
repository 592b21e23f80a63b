"""A server URL without ``/api`` is one ConfigurationError saying so, through the public API (issue 34, point 4).

The Conductor server answers the root's paths itself: ``POST /agent/start`` is 404 "No static
resource agent/start." and a GET may be the UI's page. The responses are the real server's.
"""

from __future__ import annotations

import re

import pytest

from conductor_agents import Agent, AgentRuntime, AgentSettings, ConfigurationError
from conductor_agents._wire.base_url import api_url
from conductor_agents._wire.transport import HttpError

ROOT = "http://conductor.test:8080"
NO_ROUTE = {"timestamp": "2026-12-03T15:00:00.000+00:00", "status": 404, "error": "Not Found",
            "message": "No static resource agent/start.", "path": "/agent/start"}
UI_PAGE = "<!doctype html><html><head><title>Conductor UI</title></head><body></body></html>"


@pytest.fixture
def root_server(http):
    http.add(http.POST, re.compile(ROOT + "/.*"), status=404, json=NO_ROUTE)
    http.add(http.GET, re.compile(ROOT + "/.*"), status=200, body=UI_PAGE, content_type="text/html")
    return http


def runtime(url: str) -> AgentRuntime:
    return AgentRuntime(AgentSettings(server_url=url))


def test_start_without_api_prefix_is_a_configuration_error_naming_the_fix(root_server):
    agent = Agent(name="greeter", model="openai/gpt-4o-mini", instructions="Say hello.")
    with runtime(ROOT) as rt, pytest.raises(ConfigurationError) as caught:
        rt.start(agent, "hi")
    message = str(caught.value)
    assert "\n" not in message and isinstance(caught.value, ValueError)
    assert f"{ROOT} is not the Conductor API" in message and f"{ROOT}/api" in message
    assert "CONDUCTOR_SERVER_URL" in message


@pytest.mark.parametrize("url", [ROOT, ROOT + "/"])
def test_a_get_answered_by_the_ui_page_is_the_same_error(root_server, url):
    with runtime(url) as rt, pytest.raises(ConfigurationError, match=re.escape(f"{ROOT}/api")):
        rt.attach("some-execution").status()


def test_a_404_under_api_stays_an_http_error(http):
    http.add(http.POST, re.compile(ROOT + "/api/.*"), status=404, json={**NO_ROUTE, "path": "/api/agent/start"})
    agent = Agent(name="greeter", model="openai/gpt-4o-mini", instructions="Say hello.")
    with runtime(ROOT + "/api") as rt, pytest.raises(HttpError):
        rt.start(agent, "hi")


@pytest.mark.parametrize("url, meant", [
    (ROOT, f"{ROOT}/api"),
    (ROOT + "/", f"{ROOT}/api"),
    (ROOT + "/api/v1", f"{ROOT}/api"),
    (ROOT + "/api/v1/", f"{ROOT}/api"),
    (ROOT + "/v1", f"{ROOT}/api"),
    (ROOT + "/v1/", f"{ROOT}/api"),
    ("http://proxy.test/conductor", "http://proxy.test/conductor/api"),
    ("http://proxy.test/conductor/v2", "http://proxy.test/conductor/api"),
])
def test_the_url_suggested_is_the_api_not_the_url_with_api_appended(url, meant):
    """``/api/v1`` was told to become ``/api/v1/api`` (issue 41, point 6): the suggestion is the API's URL."""
    assert api_url(url) == meant


@pytest.mark.parametrize("path", ["/api/v1", "/api/v1/", "/v1"])
def test_the_error_for_a_versioned_url_suggests_the_api(http, path):
    http.add(http.POST, re.compile(ROOT + "/.*"), status=404, json=NO_ROUTE)
    agent = Agent(name="greeter", model="openai/gpt-4o-mini", instructions="Say hello.")
    with runtime(ROOT + path) as rt, pytest.raises(ConfigurationError) as caught:
        rt.start(agent, "hi")
    assert str(caught.value).endswith(f"set CONDUCTOR_SERVER_URL (or --server-url) to {ROOT}/api")
