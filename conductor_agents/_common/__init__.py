"""The ground floor: small pieces every capability uses, with no I/O of their own.

Owns the clock (:mod:`.clock`), fork hooks (:mod:`.fork`), JSON value checks (:mod:`.json_check`), structured
values (:mod:`.structured`), argument validators with one message shape (:mod:`.checks`), an answer as the
text a check gets (:mod:`.answer_text`), secret redaction (:mod:`.secrets`), the task names this SDK gives the
server (:mod:`.task_names`), the transient-error budget (:mod:`.transient`), the background loop
(:mod:`.loops`), the one shape of an owned part, ``close()`` (:mod:`.parts`), the public face of exported
names, those a public package imports on first use included (:mod:`.public`), and Ctrl-C while the command line
starts (:mod:`.early_interrupt`).

May import: the standard library, ``attrs`` and :mod:`conductor_agents.errors`; nothing else of the package.
"""
