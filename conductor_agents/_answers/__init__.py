"""The agent's answer: guardrails that check it (:mod:`.guardrails`) and typed answers (:mod:`.output_type`).

May import: :mod:`.._tooldefs` (a function guardrail is served as a tool), :mod:`.._common` and
:mod:`conductor_agents.errors`.
"""
