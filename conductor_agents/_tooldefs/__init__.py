"""Tool definitions: what a tool is before any process runs it.

Owns the :class:`~.tooldef.ToolDef` value, schemas derived from signatures (:mod:`.schema`), the context a
running tool sees (:mod:`.context`, :mod:`.run_state`), and the tools the server runs itself
(:mod:`.server_tools`) or hands to a person (:mod:`.human_tool`). The public face is :mod:`conductor_agents.tools`.

May import: :mod:`.._common` and :mod:`conductor_agents.errors`.
"""
