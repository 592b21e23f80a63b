"""The worker: this process's side of a run's tasks. Pollers per task domain (:mod:`.poller`), the queue watcher
(:mod:`.watcher`), the tool pool (:mod:`.executor`, :mod:`.results`, :mod:`.task_watch`), counts and local events
(:mod:`.observer`), all composed by :class:`~.workers.WorkerSet`.

May import: :mod:`.._listener` (a served listener is switched by its worker), :mod:`.._liveness`,
:mod:`.._people`, :mod:`.._teams`, :mod:`.._tooldefs`, :mod:`.._wire`, :mod:`.._common` and the public value modules.
"""
