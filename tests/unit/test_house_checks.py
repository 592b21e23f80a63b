"""tests/house_checks.py finds what it is for (issue 43): an except clause naming a class beside its own
base, and a private name taken from a module of another package; and the package passes both."""

from __future__ import annotations

import ast

from tests import house_checks

_LISTENER = house_checks.PACKAGE / "_listener" / "made_up.py"
_MODULES = dict(house_checks._modules())


def _excepts(source: str) -> list[str]:
    return list(house_checks.redundant_excepts("conductor_agents._listener.made_up", _LISTENER, ast.parse(source)))


def _privates(source: str) -> list[str]:
    return list(house_checks.private_imports("conductor_agents._listener.made_up", _LISTENER, ast.parse(source),
                                             _MODULES))


def test_an_except_naming_a_subclass_beside_its_base_is_found_through_the_imports():
    found = _excepts(
        "from ..errors import ConductorAgentsError, ServerUnavailableError\n"
        "try:\n    pass\nexcept (ConductorAgentsError, ServerUnavailableError):\n    pass\n")
    assert found == [("conductor_agents/_listener/made_up.py:4: except names ServerUnavailableError beside its base "
                      "ConductorAgentsError")]


def test_builtins_lazy_imports_and_dotted_names_are_resolved_too():
    found = _excepts(
        "def f():\n"
        "    import requests\n"
        "    from .._wire.transport import HttpError\n"
        "    try:\n        pass\n"
        "    except (OSError, ConnectionError):\n        pass\n"
        "    except (requests.exceptions.RequestException, requests.exceptions.Timeout):\n        pass\n"
        "    except (HttpError, ValueError):\n        pass\n")
    assert [line.split(": ", 1)[1] for line in found] == [
        "except names ConnectionError beside its base OSError",
        "except names requests.exceptions.Timeout beside its base requests.exceptions.RequestException",
    ]


def test_a_name_it_cannot_resolve_is_reported_rather_than_passed():
    assert _excepts("try:\n    pass\nexcept (OSError, NoSuchError):\n    pass\n") == [
        "conductor_agents/_listener/made_up.py:3: cannot resolve NoSuchError in this except clause"]


def test_a_private_name_from_another_package_is_found_imported_or_read_off_its_module():
    found = _privates(
        "from .._tooldefs.schema import _split_annotated\n"
        "from ..tools import _make_tool\n"
        "from .._worker import poller as _poller\n"
        "_poller._ring_types\n")
    assert [line.split(": ", 1)[1] for line in found] == [
        "imports _split_annotated from conductor_agents._tooldefs.schema, a module of another package",
        "imports _make_tool from conductor_agents.tools, a module of another package",
        "reads _poller._ring_types of conductor_agents._worker.poller, a module of another package",
    ]


def test_private_names_inside_one_package_private_modules_and_dunders_are_fine():
    assert _privates(
        "from .chain import _link_key\n"
        "from . import chain as _chain\n"
        "from ..local_server import _proc\n"
        "from .._version import __version__\n"
        "_chain._anything\n") == []


def test_the_package_passes_both_checks():
    assert house_checks.breaches() == []
