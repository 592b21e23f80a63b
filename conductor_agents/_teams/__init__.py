"""Agents made of agents: strategies, handoffs and agent tools (:mod:`.subagents`), gates between stages
(:mod:`.gates`), stop rules (:mod:`.stopping`) and termination conditions (:mod:`.termination`), each with the
worker task that the server calls.

May import: :mod:`.._tooldefs`, :mod:`.._common` and :mod:`conductor_agents.errors`.
"""
