"""A budget of consecutive transient errors, for the loops that ask the server again after one.

A wait's status polls, the event reader's status and task-list reads and a delivery check all
follow one rule: up to ``limit`` transient errors in a row are tolerated, the next one is
raised; an error that asking again will not change is raised at once; a success starts the
count again. The caller catches what may be transient (``ServerUnavailableError``,
``HttpError``), so each loop keeps its own error types, log message and pause.

Why here and not beside ``HttpError``: counting is all this does. Whether an error may pass is
the error's own word: an ``HttpError`` carries ``transient`` (False for a status that will not
change, a 4xx but 429); an error without that attribute (``ServerUnavailableError``: no answer
at all) counts as transient.
"""

from __future__ import annotations

__all__ = ["TransientErrors"]


class TransientErrors:
    """Counts consecutive transient errors against ``limit``. Not thread-safe: one loop owns it.

    Use::

        budget = TransientErrors(limit)
        while ...:
            try:
                answer = ask()
                budget.ok()
            except (ServerUnavailableError, HttpError) as err:
                if not budget.tolerate(err):
                    raise
                log.info("... %d consecutive transient errors", budget.count)
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        #: Transient errors in a row so far (0 after a success).
        self.count = 0

    def ok(self) -> None:
        """A request succeeded: the count starts again."""
        self.count = 0

    def tolerate(self, err: BaseException) -> bool:
        """Count ``err``; False when the caller must raise it: not transient, or one past ``limit`` in a row."""
        if not getattr(err, "transient", True):
            return False
        self.count += 1
        return self.count <= self.limit
