"""An index the SQLite server's queue needs: ``queue_message (message_id)``, added once the server is up.

The server's SQLite queue pops with ``UPDATE queue_message SET popped = true WHERE message_id IN (SELECT message_id
FROM queue_message WHERE queue_name = ? ...)`` (``SqliteQueueDAO.popMessages``, 3.32.3). The table's key is
``(queue_name, message_id)``, so the outer ``WHERE``, which names no queue, scans the whole table: at every poll of
every system task's queue, many times a second, even when nothing is due. Each waiting listener keeps a row there (its
fork's parked ``JOIN``), so 1,000 idle listeners made the server's system-task pollers the largest part of its idle
CPU (``benchmarks/results.md``). With an index on ``message_id`` the outer ``UPDATE`` is a lookup of the few ids the
inner query found. The index changes no result and no other statement; the server's migrations never name it.

For a server of your own, the same statement, once (``docs/operations.md``)::

    CREATE INDEX IF NOT EXISTS conductor_agents_queue_message_id ON queue_message (message_id);
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from pathlib import Path

__all__ = ["INDEX_NAME", "add_queue_index"]

_log = logging.getLogger("conductor_agents.local_server")

INDEX_NAME = "conductor_agents_queue_message_id"
_STATEMENT = f"CREATE INDEX IF NOT EXISTS {INDEX_NAME} ON queue_message (message_id)"


def add_queue_index(database: Path, *, busy_timeout: float = 15.0) -> bool:
    """Add the index to the server's SQLite file ``database`` (the server running on it: SQLite serialises the write
    with the server's own); whether it is there. Never raises: without it the server is only slower."""
    if not database.is_file():
        return False
    try:
        with contextlib.closing(sqlite3.connect(database, timeout=busy_timeout)) as connection:
            connection.execute(_STATEMENT)
            connection.commit()
    except sqlite3.Error as err:
        _log.warning("the index %s could not be added to %s (%s); the server's queue polls scan their table",
                     INDEX_NAME, database, err)
        return False
    return True
