"""Fixtures shared by the unit tests."""

from __future__ import annotations

import pytest
import responses


@pytest.fixture
def http():
    """``responses`` intercepting every request of the test (a module may override it with stubs added)."""
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        yield mock
