"""Agents made of agents: strategies, handoffs and agent tools (:mod:`.subagents`), gates between stages
(:mod:`.gates`), stop rules (:mod:`.stopping`) and termination conditions (:mod:`.termination`), each with the
worker task that the server calls; and compiling an agent tree into the server's config (:mod:`.compile`),
with one run's model settings applied to it (:mod:`.model_settings`).

May import: :mod:`.._answers`, :mod:`.._tooldefs`, :mod:`.._common` and :mod:`conductor_agents.errors`.
"""
