"""Listeners that last: a continued listener's runs form a chain (:mod:`.chain`, :mod:`.directory`); the serving
process switches link *n* to *n+1* (:mod:`.driver`, the rule in :mod:`.switch_rule`, :mod:`.switch`,
:mod:`.carryover`, :mod:`.budget`); callers follow the chain to send (:mod:`.sending`), answer people and send by
any id of it (:mod:`.by_id`, behind the handle's verbs), check delivery (:mod:`.delivery`), read status, totals
and an ended run's result (:mod:`.following`; over every run still held: :mod:`.history`) and events
(:mod:`.chained_events`), list an agent's running runs one row per listener (:mod:`.running`), and set a run's
standing signal, which a switch carries over (:mod:`.signals`). The serving process retires the older ended
links (:mod:`.retention`) after writing where the newest is (:mod:`.head`).

May import: :mod:`.._events`, :mod:`.._teams` (a start's model settings), :mod:`.._answers` (an ended run's
output check), :mod:`.._people`, :mod:`.._tooldefs`, :mod:`.._wire`, :mod:`.._common`, and the public modules
:mod:`conductor_agents.agent`, :mod:`~conductor_agents.tools`, :mod:`~conductor_agents.continuation`,
:mod:`~conductor_agents.events`, :mod:`~conductor_agents.settings`, :mod:`~conductor_agents.result` and
:mod:`~conductor_agents.errors`.
"""
