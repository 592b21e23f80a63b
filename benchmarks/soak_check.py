"""The soak's invariant checker (``benchmarks/soak.py``): a pure function over what the soak recorded.

Inputs, all plain JSON-like records (times are epoch seconds, one host's clock):

- ``sends``: one per message a sender tried: ``{uid, to, sender, seq, t, outcome}``, ``outcome`` being
  ``"accepted"`` (the server took it), ``"refused"`` (the server said no: paused, ended, queue full; it
  was not queued) or ``"uncertain"`` (no answer: a timeout, a dropped connection, a 5xx);
- ``journal``: one per message a listener's recording tool acted on: ``{to, uid, sender, seq, t, pid,
  exec, run, key, tool}`` (``key``: the call's idempotency key, the same on every delivery of one call);
- ``approvals``: one per approval the soak's person gave: ``{to, uids, t, outcome}`` (``"approved"`` or
  the error's name);
- ``listeners``: ``{id: {kind, run_id}}``; ``pauses``: ``[{to, t0, t1}]``; ``faults``: ``[{kind, t0, t1}]``;
- ``server``: the server's view after the drain: ``{listeners: {id: {status}}, unserved: [{to, run,
  last_poll_age_s}]}``.

:func:`check` returns every violation by kind (with examples) and what the server documents as its own
behaviour in a category of its own (``documented``): messages a SQLite server's restart dropped from its
in-memory queue, a tool call handed back by a process that died and run again with the same idempotency key.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

Record = Mapping[str, Any]
#: Findings by kind: each a list of examples.
Found = dict[str, list[dict[str, Any]]]
#: Adds an example of a kind to findings.
Add = Callable[[Found, str, dict[str, Any]], None]

#: The kinds of fault that restart the server's in-memory message queue (a SQLite node's restart).
QUEUE_LOSING_FAULTS = ("restart_server",)
#: The kinds of fault during which the server is down or frozen (left out of a listener's time without
#: progress; a cluster's frozen node counts too, though its peer still answers).
SERVER_DOWN_FAULTS = ("restart_server", "restart_redis", "freeze_server")
#: Examples kept per kind in the result.
EXAMPLES = 10


def check(*, sends: Sequence[Record], journal: Sequence[Record], approvals: Sequence[Record] = (),
          listeners: Mapping[str, Record], pauses: Sequence[Record] = (), faults: Sequence[Record] = (),
          server: Record | None = None, end: float, wedge_bound: float,
          gated_kinds: Iterable[str] = ("gate",)) -> dict[str, Any]:
    """Every invariant over one soak. ``end``: when the drain ended (a message not acted on by then
    never was); ``wedge_bound``: the longest a listener may go without progress while a message waits
    for it (the stall bound plus adoption plus a server's re-evaluation after a restart)."""
    violations: Found = {}
    documented: Found = {}

    def add(into: Found, kind: str, example: dict[str, Any]) -> None:
        into.setdefault(kind, []).append(example)

    accepted = {s["uid"]: s for s in sends if s.get("outcome") == "accepted"}
    uncertain = {s["uid"]: s for s in sends if s.get("outcome") == "uncertain"}
    acts: dict[str, list[Record]] = {}
    for line in sorted(journal, key=lambda r: r["t"]):
        acts.setdefault(line["uid"], []).append(line)

    for uid, lines in acts.items():
        sent = accepted.get(uid) or uncertain.get(uid)
        if sent is None:
            add(violations, "acted_on_never_sent", {"uid": uid, "journal": list(lines)})
            continue
        for line in lines:
            info = listeners.get(sent["to"]) or {}
            if line.get("to") != sent["to"] or (info.get("run_id") and line.get("run") != info["run_id"]):
                add(violations, "acted_on_by_another_listener", {"uid": uid, "sent_to": sent["to"],
                                                                  "listener_run": info.get("run_id"), "journal": line})
        keys = [line.get("key") for line in lines]
        if len(lines) > 1:
            example = {"uid": uid, "to": sent["to"], "journal": list(lines)}
            if len(set(keys)) == 1:  # the same call delivered again: a handed-back task (docs: at least once)
                add(documented, "same_call_run_again", example)
            else:
                add(violations, "acted_on_twice", example)

    _never_acted(accepted, acts, faults, listeners, add, violations, documented)
    _order(accepted, acts, add, violations)
    lost = {e["uid"] for e in documented.get("lost_at_server_restart", [])}
    _wedged(accepted, acts, lost, pauses, faults, end, wedge_bound, add, violations)
    _approvals(accepted, acts, approvals, listeners, set(gated_kinds), add, violations)
    _server_view(server or {}, listeners, wedge_bound, add, violations)

    outcomes: dict[str, int] = {}
    for s in sends:
        key = f"{s.get('sender', '?')}:{s.get('outcome')}"
        outcomes[key] = outcomes.get(key, 0) + 1
    return {
        "counts": {"sent": len(sends), "accepted": len(accepted), "uncertain": len(uncertain),
                   "acted_on": len(acts), "journal_lines": len(journal), "by_sender": outcomes},
        "violations": {kind: {"count": len(v), "examples": v[:EXAMPLES]} for kind, v in sorted(violations.items())},
        "documented": {kind: {"count": len(v), "examples": v[:EXAMPLES]} for kind, v in sorted(documented.items())},
    }


def _never_acted(accepted: Mapping[str, Record], acts: Mapping[str, list[Record]], faults: Sequence[Record],
                 listeners: Mapping[str, Record], add: Add, violations: Found, documented: Found) -> None:
    """Accepted, never acted on. Lost at a server restart (documented) when a restart that drops the queue
    ended after it was accepted (a stopping server still takes messages) while it was still queued: no
    later-accepted message to the same listener was acted on before that restart began (the queue is first
    in, first out)."""
    restarts = sorted((f["t0"], f.get("t1", f["t0"])) for f in faults if f.get("kind") in QUEUE_LOSING_FAULTS)
    acted_by_listener: dict[str, list[tuple[float, float]]] = {}  # to -> (accepted at, acted at)
    for uid, lines in acts.items():
        sent = accepted.get(uid)
        if sent is not None:
            acted_by_listener.setdefault(sent["to"], []).append((sent["t"], lines[0]["t"]))
    for uid, sent in accepted.items():
        if uid in acts:
            continue
        example = {"uid": uid, "to": sent["to"], "sender": sent.get("sender"), "seq": sent.get("seq"),
                   "accepted_at": sent["t"], "kind": (listeners.get(sent["to"]) or {}).get("kind")}
        later = acted_by_listener.get(sent["to"], [])
        lost_at = next((t0 for t0, t1 in restarts if t1 >= sent["t"] and not any(
            a > sent["t"] and done < t0 for a, done in later)), None)
        if lost_at is not None:
            add(documented, "lost_at_server_restart", {**example, "restart_at": lost_at})
        else:
            add(violations, "accepted_never_acted_on", example)


def _order(accepted: Mapping[str, Record], acts: Mapping[str, list[Record]], add: Add, violations: Found) -> None:
    """Per (listener, sender), the messages acted on in the order they were accepted (first action each)."""
    streams: dict[tuple[str, str], list[tuple[float, int, str]]] = {}
    for uid, lines in acts.items():
        sent = accepted.get(uid)
        if sent is not None:
            streams.setdefault((sent["to"], sent["sender"]), []).append((lines[0]["t"], int(sent["seq"]), uid))
    for (to, sender), stream in sorted(streams.items()):
        stream.sort()
        top: tuple[float, int, str] | None = None
        for item in stream:
            if top is not None and item[1] < top[1]:
                add(violations, "acted_on_out_of_order", {
                    "to": to, "sender": sender, "uid": item[2], "seq": item[1], "acted_at": item[0],
                    "after_uid": top[2], "after_seq": top[1], "after_acted_at": top[0]})
            if top is None or item[1] > top[1]:
                top = item


def _paused(pauses: Sequence[Record], to: str, t0: float, t1: float) -> float:
    """Seconds of [t0, t1] during which listener ``to`` was paused (windows do not overlap)."""
    return sum(max(0.0, min(t1, float(p["t1"])) - max(t0, float(p["t0"]))) for p in pauses if p["to"] == to)


def _wedged(accepted: Mapping[str, Record], acts: Mapping[str, list[Record]], lost: set[str],
            pauses: Sequence[Record], faults: Sequence[Record], end: float, bound: float, add: Add,
            violations: Found) -> None:
    """A listener that made no progress for longer than ``bound`` (its paused time and the server's restarts
    left out) while a message accepted for it waited. Progress: any message of that listener acted on.
    A message never acted on (reported on its own) waits only if its listener acted on nothing accepted
    after it, until the end; one a restart lost (``lost``) does not wait."""
    waiting: dict[str, list[tuple[float, float]]] = {}
    progress: dict[str, list[float]] = {}
    down = _union([(f["t0"], f.get("t1", f["t0"])) for f in faults if f.get("kind") in SERVER_DOWN_FAULTS])
    for uid, sent in accepted.items():
        if uid in acts:
            waiting.setdefault(sent["to"], []).append((sent["t"], max(sent["t"], acts[uid][0]["t"])))
        elif uid not in lost and not any(accepted[other]["to"] == sent["to"] and accepted[other]["t"] > sent["t"]
                                         for other in acts if other in accepted):
            waiting.setdefault(sent["to"], []).append((sent["t"], max(sent["t"], end)))
    for uid, lines in acts.items():
        if uid in accepted:
            progress.setdefault(accepted[uid]["to"], []).append(lines[0]["t"])
    for to, spans in sorted(waiting.items()):
        marks = sorted(progress.get(to, []))
        for start, stop in _union(spans):
            points = [start, *(m for m in marks if start < m < stop), stop]
            for a, b in itertools.pairwise(points):
                idle = (b - a) - _paused(pauses, to, a, b) - _down(down, a, b)
                if idle > bound:
                    add(violations, "listener_wedged", {
                        "to": to, "from": a, "until": b, "idle_s": round(idle, 1),
                        "faults_meanwhile": [f"{f['kind']}@{f['t0']:.0f}" for f in faults
                                             if f["t0"] <= b and f.get("t1", f["t0"]) >= a - bound]})


def _down(windows: list[tuple[float, float]], t0: float, t1: float) -> float:
    """Seconds of [t0, t1] during which the server was down (``windows`` do not overlap)."""
    return sum(max(0.0, min(t1, b) - max(t0, a)) for a, b in windows)


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _approvals(accepted: Mapping[str, Record], acts: Mapping[str, list[Record]], approvals: Sequence[Record],
               listeners: Mapping[str, Record], gated: set[str], add: Add, violations: Found) -> None:
    """Every approval given is applied once: its call acted on (not lost), no call approved twice, and no
    call of a listener whose tool needs approval acted on without one (an approval whose answer was lost,
    ``uncertain:...``, may have been applied: it counts as one only there)."""
    given: dict[str, list[Record]] = {}
    maybe: set[str] = set()
    for a in approvals:
        outcome = str(a.get("outcome"))
        for uid in a.get("uids") or ():
            if outcome == "approved":
                given.setdefault(uid, []).append(a)
            elif outcome.startswith("uncertain"):
                maybe.add(uid)
    for uid, answers in sorted(given.items()):
        if uid not in acts:
            add(violations, "approval_lost", {"uid": uid, "approvals": answers})
        if len(answers) > 1:
            add(violations, "approved_twice", {"uid": uid, "approvals": answers})
    for uid, lines in sorted(acts.items()):
        sent = accepted.get(uid)
        if sent is not None and (listeners.get(sent["to"]) or {}).get("kind") in gated and uid not in given \
                and uid not in maybe:
            add(violations, "acted_on_without_approval", {"uid": uid, "to": sent["to"], "journal": list(lines)})


def _server_view(server: Record, listeners: Mapping[str, Record], bound: float, add: Add, violations: Found) -> None:
    """Listeners the server no longer runs, and runs it runs that no process serves."""
    for to, info in sorted((server.get("listeners") or {}).items()):
        if info.get("status") not in ("RUNNING", "PAUSED"):
            add(violations, "listener_ended", {"to": to, "kind": (listeners.get(to) or {}).get("kind"), **info})
    for row in server.get("unserved") or ():
        age = row.get("last_poll_age_s")
        if age is None or age > bound:
            add(violations, "run_orphaned", dict(row))
    for row in server.get("split") or ():
        add(violations, "run_split", dict(row))


def summary_lines(result: Mapping[str, Any]) -> list[str]:
    """The checker's result as a few printable lines."""
    lines = []
    for section in ("violations", "documented"):
        kinds = result.get(section) or {}
        lines.append(f"{section}: " + (", ".join(f"{k} {v['count']}" for k, v in kinds.items()) or "none"))
    return lines


def recheck(result: Mapping[str, Any], workdir: str) -> dict[str, Any]:
    """:func:`check` again over a finished soak: its result (``--out``) and its work directory's files."""
    import glob
    import json
    import os

    def lines(pattern: str) -> list[dict[str, Any]]:
        out = []
        for path in sorted(glob.glob(os.path.join(workdir, pattern))):
            with open(path, encoding="utf-8") as fh:
                for line in fh:
                    try:
                        out.append(json.loads(line))
                    except ValueError:
                        continue  # a line cut by a SIGKILL (never reported as done)
        return out

    events = lines("events.jsonl")
    return check(sends=lines("sends-*.jsonl"), journal=lines("journal-*.jsonl"),
                 approvals=[e for e in events if e.get("event") == "approval"],
                 pauses=[e for e in events if e.get("event") == "pause"],
                 faults=[e for e in events if e.get("event") == "fault"], listeners=result["listeners"],
                 server=result.get("server_view"), end=float(result["check_end"]),
                 wedge_bound=float(result["wedge_bound_s"]))


if __name__ == "__main__":
    import json
    import sys

    with open(sys.argv[1], encoding="utf-8") as fh:
        again = recheck(json.load(fh), sys.argv[2])
    print(json.dumps(again, indent=1))
