"""Errors about a continued listener name the id the caller holds, and its run after it (pure; no I/O).

A verb on a continued listener acts on one of its runs (a link, :mod:`.chain`), whose id the caller never
held: the caller holds the listener's (its mailbox's, or its link 0's). An error met in a run is renamed
before it leaves the verb: its ``execution_id`` is the caller's id, and its message names the listener
first and the run after, where the run helps to debug (``listener <id> (its run <run id>)``).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
from collections.abc import Callable, Iterator
from typing import ParamSpec, TypeVar

from ..errors import ConductorAgentsError, ServerError, WorkerStallError
from .directory import Chain

__all__ = ["held_stall", "named_for", "names_errors", "rename", "run_name"]

P = ParamSpec("P")
R = TypeVar("R")


def run_name(listener_id: str, execution_id: str, *, current: bool = False) -> str:
    """How a message names run ``execution_id`` of the listener the caller holds as ``listener_id``:
    ``run <id>`` when they are one, else ``listener <id> (its [current ]run <run id>)``."""
    if execution_id == listener_id:
        return f"run {listener_id}"
    return f"listener {listener_id} (its {'current ' if current else ''}run {execution_id})"


def rename(err: ConductorAgentsError, listener_id: str) -> ConductorAgentsError:
    """``err``, met in a run of the listener the caller holds as ``listener_id``, named by that id (in
    place; returned).

    An error with an ``execution_id`` of another run gets ``listener_id`` instead, and its message names
    the listener where it named the run (``run <run id>`` or ``execution '<run id>'`` becomes
    :func:`run_name`'s words), or else begins with ``listener <id>:``; a server error without one (a
    request's path names the run) begins so too unless it names the listener. A request or answer the
    error carries (``last_answer``, ``winner``) is named by the listener's id as well. An error of the
    run the caller holds, and any other (a bad argument), keeps its words.
    """
    text = str(err.args[0]) if err.args else ""
    run = getattr(err, "execution_id", None)
    renamed = text
    if isinstance(run, str) and run and run != listener_id:
        err.execution_id = listener_id  # type: ignore[attr-defined]  # every such error has the field
        said = [words for words in (f"run {run}", f"execution {run!r}", f"execution {run}") if words in text]
        renamed = text.replace(said[0], run_name(listener_id, run), 1) if said else f"listener {listener_id}: {text}"
    elif run is None and isinstance(err, ServerError) and listener_id not in text:
        renamed = f"listener {listener_id}: {text}"
    if renamed != text:
        err.args = (renamed, *err.args[1:])
    for field in ("last_answer", "winner"):
        known_as = getattr(getattr(err, field, None), "known_as", None)
        if callable(known_as):
            setattr(err, field, known_as(listener_id))
    return err


@contextlib.contextmanager
def named_for(chain: Chain) -> Iterator[None]:
    """Within it, an error of this package is renamed (:func:`rename`) by the id the caller holds for
    ``chain``, when it is a continued listener's."""
    try:
        yield
    except ConductorAgentsError as err:
        if chain.continuable:
            rename(err, chain.execution_id)
        raise


def names_errors(verb: Callable[P, R]) -> Callable[P, R]:
    """``verb`` (a function with a ``chain`` argument, a :class:`Chain`) with its errors named by the id the
    caller holds for that chain, as :func:`named_for` does (nothing is looked at until one is raised)."""
    signature = inspect.signature(verb)

    @functools.wraps(verb)
    def named(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return verb(*args, **kwargs)
        except ConductorAgentsError as err:
            chain = signature.bind(*args, **kwargs).arguments["chain"]
            if chain.continuable:
                rename(err, chain.execution_id)
            raise

    return named


def held_stall(stall: WorkerStallError, listener_id: str) -> WorkerStallError:
    """The stall a run of the listener has (its watch's error), as the handle holding ``listener_id`` tells it:
    ``stall`` itself when it is that run's, else a copy named by the listener (:func:`rename`)."""
    if stall.execution_id == listener_id:
        return stall
    held = rename(copy.copy(stall), listener_id)
    assert isinstance(held, WorkerStallError)
    return held
