"""The soak's invariant checker (benchmarks/soak_check.py) on small hand-made journals."""

from __future__ import annotations

from typing import Any

from benchmarks.soak_check import check, summary_lines

A, B = "listener-a", "listener-b"
LISTENERS = {A: {"kind": "plain", "run_id": "run-a"}, B: {"kind": "gate", "run_id": "run-b"}}


def sent(uid: str, to: str, seq: int, t: float, sender: str = "sdk", outcome: str = "accepted") -> dict:
    return {"uid": uid, "to": to, "sender": sender, "seq": seq, "t": t, "outcome": outcome}


def acted(uid: str, to: str, t: float, *, key: str = "", run: str = "") -> dict:
    return {"uid": uid, "to": to, "t": t, "run": run or LISTENERS[to]["run_id"], "key": key or f"key-{uid}",
            "pid": 1}


def approved(uid: str, to: str = B, t: float = 0.0, outcome: str = "approved") -> dict:
    return {"to": to, "uids": [uid], "t": t, "outcome": outcome}


def run(sends: list, journal: list, **kw: Any) -> dict:
    kw.setdefault("end", 1000.0)
    kw.setdefault("wedge_bound", 100.0)
    return check(sends=sends, journal=journal, listeners=LISTENERS, **kw)


def kinds(result: dict, section: str = "violations") -> dict:
    return {kind: found["count"] for kind, found in result[section].items()}


def test_a_clean_history_has_no_violation():
    sends = [sent("u1", A, 1, 10.0), sent("u2", A, 2, 11.0), sent("u3", B, 3, 12.0),
             sent("u4", A, 4, 13.0, outcome="refused")]
    journal = [acted("u1", A, 12.0), acted("u2", A, 14.0), acted("u3", B, 20.0)]
    result = run(sends, journal, approvals=[approved("u3")],
                 server={"listeners": {A: {"status": "RUNNING"}, B: {"status": "RUNNING"}},
                         "unserved": [{"to": A, "run": "r", "last_poll_age_s": 1.0}]})
    assert result["violations"] == {} and result["documented"] == {}
    assert result["counts"]["accepted"] == 3 and result["counts"]["acted_on"] == 3
    assert summary_lines(result) == ["violations: none", "documented: none"]


def test_an_accepted_message_never_acted_on_is_a_violation_but_a_refused_or_uncertain_one_is_not():
    sends = [sent("u1", A, 1, 10.0), sent("u2", A, 2, 11.0, outcome="refused"),
             sent("u3", A, 3, 12.0, outcome="uncertain")]
    result = run(sends, [], end=50.0)
    assert kinds(result) == {"accepted_never_acted_on": 1}
    assert result["violations"]["accepted_never_acted_on"]["examples"][0]["uid"] == "u1"


def test_a_message_queued_at_a_sqlite_restart_is_documented_lost_not_a_violation():
    # u1 accepted at 10, the server restarted at 20 with u1 still queued (nothing after it acted on before 20).
    sends = [sent("u1", A, 1, 10.0), sent("u2", A, 2, 30.0)]
    journal = [acted("u2", A, 60.0)]
    result = run(sends, journal, faults=[{"kind": "restart_server", "t0": 20.0, "t1": 40.0}])
    assert kinds(result) == {} and kinds(result, "documented") == {"lost_at_server_restart": 1}
    assert result["documented"]["lost_at_server_restart"]["examples"][0]["restart_at"] == 20.0
    # Accepted by a server that was stopping (the restart had begun): lost the same way.
    result = run([sent("u1", A, 1, 25.0)], [], faults=[{"kind": "restart_server", "t0": 20.0, "t1": 40.0}], end=60.0)
    assert kinds(result) == {} and kinds(result, "documented") == {"lost_at_server_restart": 1}
    # Accepted after the restart ended: a violation.
    result = run([sent("u1", A, 1, 45.0)], [], faults=[{"kind": "restart_server", "t0": 20.0, "t1": 40.0}], end=60.0)
    assert kinds(result) == {"accepted_never_acted_on": 1}


def test_a_message_skipped_while_a_later_one_was_acted_on_before_the_restart_is_a_violation():
    # u2 (accepted after u1) was acted on before the restart: u1 had left the queue by then, and was lost elsewhere.
    sends = [sent("u1", A, 1, 10.0), sent("u2", A, 2, 11.0)]
    journal = [acted("u2", A, 15.0)]
    result = run(sends, journal, faults=[{"kind": "restart_server", "t0": 20.0, "t1": 40.0}])
    assert kinds(result) == {"accepted_never_acted_on": 1}
    # Other faults (a serving process killed) never excuse a lost message.
    result = run([sent("u1", A, 1, 10.0)], [], faults=[{"kind": "kill_serve", "t0": 20.0, "t1": 25.0}], end=50.0)
    assert kinds(result) == {"accepted_never_acted_on": 1}


def test_acted_on_twice_by_two_calls_is_a_violation_the_same_call_run_again_is_documented():
    sends = [sent("u1", A, 1, 10.0), sent("u2", A, 2, 11.0)]
    journal = [acted("u1", A, 12.0, key="k1"), acted("u1", A, 13.0, key="k1b"),
               acted("u2", A, 14.0, key="k2"), acted("u2", A, 40.0, key="k2")]
    result = run(sends, journal)
    assert kinds(result) == {"acted_on_twice": 1} and kinds(result, "documented") == {"same_call_run_again": 1}
    assert result["violations"]["acted_on_twice"]["examples"][0]["uid"] == "u1"


def test_out_of_order_per_listener_and_sender():
    sends = [sent("u1", A, 1, 10.0), sent("u2", A, 2, 11.0), sent("u3", A, 3, 12.0),
             sent("r1", A, 1, 10.5, sender="rest")]
    journal = [acted("u2", A, 20.0), acted("u1", A, 21.0), acted("u3", A, 22.0), acted("r1", A, 19.0)]
    result = run(sends, journal)
    assert kinds(result) == {"acted_on_out_of_order": 1}
    example = result["violations"]["acted_on_out_of_order"]["examples"][0]
    assert (example["uid"], example["after_uid"], example["sender"]) == ("u1", "u2", "sdk")


def test_a_message_acted_on_by_another_listener_or_never_sent():
    sends = [sent("u1", A, 1, 10.0)]
    journal = [acted("u1", A, 12.0, run="run-b"), acted("ghost", A, 13.0)]
    result = run(sends, journal)
    assert kinds(result) == {"acted_on_by_another_listener": 1, "acted_on_never_sent": 1}
    # An uncertain send that was acted on is fine (the server had queued it).
    assert kinds(run([sent("u1", A, 1, 10.0, outcome="uncertain")], [acted("u1", A, 11.0)])) == {}


def test_a_listener_without_progress_for_longer_than_the_bound_is_wedged_its_paused_time_left_out():
    sends = [sent("u1", A, 1, 10.0), sent("u2", A, 2, 20.0)]
    journal = [acted("u1", A, 15.0), acted("u2", A, 200.0)]  # u2 waited from 20 to 200: idle 180 s
    result = run(sends, journal, faults=[{"kind": "kill_serve", "t0": 50.0, "t1": 55.0}])
    assert kinds(result) == {"listener_wedged": 1}
    example = result["violations"]["listener_wedged"]["examples"][0]
    assert example["to"] == A and example["idle_s"] == 180.0 and example["faults_meanwhile"] == ["kill_serve@50"]
    # Paused from 30 to 150: 65 s idle, under the bound.
    assert kinds(run(sends, journal, pauses=[{"to": A, "t0": 30.0, "t1": 150.0}])) == {}
    # The server restarting from 30 to 150: the same (another listener's pause does not count).
    assert kinds(run(sends, journal, faults=[{"kind": "restart_server", "t0": 30.0, "t1": 150.0}])) == {}
    assert kinds(run(sends, journal, pauses=[{"to": B, "t0": 30.0, "t1": 150.0}])) == {"listener_wedged": 1}
    # Idle with nothing waiting is not wedged.
    assert kinds(run([sent("u1", A, 1, 10.0), sent("u2", A, 2, 500.0)],
                     [acted("u1", A, 12.0), acted("u2", A, 510.0)])) == {}


def test_a_message_never_acted_on_wedges_its_listener_until_the_end_unless_later_ones_were_acted_on():
    result = run([sent("u1", A, 1, 10.0)], [], end=500.0)
    assert kinds(result) == {"accepted_never_acted_on": 1, "listener_wedged": 1}
    # Lost (a violation of its own), but the listener went on with a later message: not wedged.
    result = run([sent("u1", A, 1, 10.0), sent("u2", A, 2, 300.0)], [acted("u2", A, 301.0)], end=500.0)
    assert kinds(result) == {"accepted_never_acted_on": 1}
    # Lost at a restart, nothing else sent to it: documented, and the listener is not wedged.
    result = run([sent("u1", A, 1, 10.0)], [], end=500.0, faults=[{"kind": "restart_server", "t0": 11.0, "t1": 20.0}])
    assert kinds(result) == {} and kinds(result, "documented") == {"lost_at_server_restart": 1}


def test_approvals_lost_given_twice_or_missing():
    sends = [sent("g1", B, 1, 10.0), sent("g2", B, 2, 11.0), sent("g3", B, 3, 12.0)]
    journal = [acted("g2", B, 20.0), acted("g3", B, 21.0)]
    approvals = [approved("g1"), approved("g2"), approved("g2"), approved("g3", outcome="refused:NothingPendingError")]
    result = run(sends, journal, approvals=approvals)
    assert kinds(result) == {"accepted_never_acted_on": 1, "approval_lost": 1, "approved_twice": 1,
                             "acted_on_without_approval": 1}
    assert result["violations"]["approval_lost"]["examples"][0]["uid"] == "g1"
    assert result["violations"]["acted_on_without_approval"]["examples"][0]["uid"] == "g3"
    # An approval whose answer was lost (it may have been applied) excuses the action, and is not lost itself.
    result = run(sends[2:], journal[1:], approvals=[approved("g3", outcome="uncertain:ServerUnavailableError")])
    assert kinds(result) == {}


def test_the_servers_view_ended_listeners_and_unserved_runs():
    server = {"listeners": {A: {"status": "FAILED"}, B: {"status": "PAUSED"}},
              "unserved": [{"to": B, "run": "r1", "last_poll_age_s": 500.0},
                           {"to": A, "run": "r2", "last_poll_age_s": None},
                           {"to": A, "run": "r3", "last_poll_age_s": 3.0}]}
    result = run([], [], server=server)
    assert kinds(result) == {"listener_ended": 1, "run_orphaned": 2}
    assert [e["run"] for e in result["violations"]["run_orphaned"]["examples"]] == ["r1", "r2"]


def test_a_listener_polled_by_a_live_process_that_does_not_hold_its_lease_is_a_split():
    """Seen in the cluster soak: two processes served four listeners (one adopted on a stale view of who was
    present); the owner's polls were hidden by the other's (the poll data keeps the last poller only)."""
    server = {"listeners": {A: {"status": "RUNNING"}},
              "split": [{"to": A, "owner": "w1", "lease": 3, "other_poller": "w2", "other_poll_age_s": 2.0}]}
    assert kinds(run([], [], server=server)) == {"run_split": 1}
