"""The agent's answer: guardrails that check it (:mod:`.guardrails`), typed answers (:mod:`.output_type`) and
the check of each answer against the type in the run (:mod:`.output_check`).

May import: :mod:`.._tooldefs` (a function guardrail is served as a tool), :mod:`.._common` and
:mod:`conductor_agents.errors`.
"""
