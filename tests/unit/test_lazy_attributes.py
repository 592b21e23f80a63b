"""Names the public packages import on first use: LocalServer and testing.LocalCluster."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conductor_agents._common.public import lazy_attributes


def test_importing_the_packages_does_not_import_the_local_server():
    code = ("import sys, conductor_agents, conductor_agents.testing; "
            "print('conductor_agents.local_server' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.strip() == "False"


def test_testing_local_cluster_resolves_to_the_local_server_class():
    import conductor_agents.testing
    from conductor_agents.local_server import LocalCluster

    assert conductor_agents.testing.LocalCluster is LocalCluster


def test_a_lazy_name_is_imported_from_its_home_and_others_are_attribute_errors():
    attribute = lazy_attributes("pkg", dumps="json")
    import json

    assert attribute("dumps") is json.dumps
    with pytest.raises(AttributeError, match="module 'pkg' has no attribute 'loads'"):
        attribute("loads")
