"""People in the loop: what a run waits for from a person (:mod:`.pending`), answering it (:mod:`.approvals`),
telling the application (:mod:`.pending_watch`) and the worker's half of an approval (:mod:`.approval_gate`).

May import: :mod:`.._wire`, :mod:`.._common`, :mod:`conductor_agents.result` and :mod:`conductor_agents.errors`.
"""
