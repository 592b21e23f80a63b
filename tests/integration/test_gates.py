"""Gates between the stages of a sequential team, on the real server: a text gate the server checks, a Python
gate served here (on the run's domain when the team is stateful), and what stopping leaves as the answer."""

from __future__ import annotations

import threading

import pytest

from conductor_agents import Agent, Gate, RunStatus
from conductor_agents._common.task_names import gate_task_name

pytestmark = pytest.mark.integration


class Seen:
    """What each stage's model and each gate was asked, and on which thread (thread-safe)."""

    def __init__(self) -> None:
        self.items: list = []
        self.lock = threading.Lock()

    def add(self, *item) -> None:
        with self.lock:
            self.items.append((*item, threading.current_thread().name))

    def of(self, kind: str) -> list:
        with self.lock:
            return [item[1:-1] for item in self.items if item[0] == kind]

    def threads_of(self, kind: str) -> set:
        with self.lock:
            return {item[-1] for item in self.items if item[0] == kind}

    def gate(self, decision: bool) -> Gate:
        """A Python gate that records each answer it is asked about (as "gate") and returns ``decision``."""

        def check(answer: str) -> bool:
            self.add("gate", answer)
            return decision

        return Gate.function(check)


def pipeline(scripted_llm, unique_name, seen: Seen, answers: dict, gates: dict, *, stateful: bool = False):
    """A team of the stages one, two, three (in order), each answering ``answers[stage]``; ``gates[stage]``
    after it."""
    stages = []
    for stage in ("one", "two", "three"):
        def policy(request, stage=stage):
            seen.add("model", stage)
            return answers[stage]

        stages.append(Agent(name=unique_name(stage), model=scripted_llm.script(policy=policy),
                            gate=gates.get(stage)))
    team = Agent(name=unique_name("pipe"), model=scripted_llm.script(["never asked"]), agents=stages,
                 strategy="sequential", stateful=stateful)
    return team, [s.name for s in stages]


def test_a_text_gate_stops_the_pipeline_after_its_stage(agent_runtime, scripted_llm, unique_name):
    """Gate.text_contains: the server finds the text in stage one's answer (in any case) and ends the pipeline
    there: two and three never run, and stage one's answer is the run's."""
    seen = Seen()
    team, names = pipeline(scripted_llm, unique_name, seen,
                           {"one": "Verdict: reject (spam)", "two": "drafted", "three": "sent"},
                           {"one": Gate.text_contains("REJECT", case_sensitive=False)})
    result = agent_runtime.run(team, "Triage this mail.", timeout=120)
    assert result.status is RunStatus.COMPLETED, result.error
    assert result.agents_run == (names[0],)
    assert result.output == "Verdict: reject (spam)"
    assert seen.of("model") == [("one",)]
    assert gate_task_types(agent_runtime, result.execution_id) == ["INLINE"]  # no worker: the server decided


def gate_task_types(agent_runtime, execution_id: str) -> list:
    tasks = agent_runtime._api.get_workflow(execution_id, include_tasks=True)["tasks"]
    return [t["taskType"] for t in tasks if t.get("referenceTaskName", "").endswith("_gate_0")]


def test_a_text_gate_that_does_not_match_lets_every_stage_run(agent_runtime, scripted_llm, unique_name):
    """The same gate, case-sensitive, on an answer with the text in another case: the pipeline goes on."""
    seen = Seen()
    team, names = pipeline(scripted_llm, unique_name, seen,
                           {"one": "Verdict: reject (spam)", "two": "drafted", "three": "sent"},
                           {"one": Gate.text_contains("REJECT")})
    result = agent_runtime.run(team, "Triage this mail.", timeout=120)
    assert result.status is RunStatus.COMPLETED, result.error
    assert result.agents_run == tuple(names)
    assert result.output == "sent"
    assert seen.of("model") == [("one",), ("two",), ("three",)]
    assert gate_task_types(agent_runtime, result.execution_id) == ["INLINE"]


@pytest.mark.parametrize("stop", [True, False])
def test_a_python_gate_decides_after_its_stage(stop, agent_runtime, scripted_llm, unique_name):
    """Gate.function: the server asks the function (a worker task here) with the stage's answer; True stops."""
    seen = Seen()

    team, names = pipeline(scripted_llm, unique_name, seen, {"one": "first answer", "two": "drafted", "three": "sent"},
                           {"one": seen.gate(stop)})
    result = agent_runtime.run(team, "Go.", timeout=120)
    assert result.status is RunStatus.COMPLETED, result.error
    assert seen.of("gate") == [("first answer",)]
    assert all(name.startswith("conductor-agents-tool") for name in seen.threads_of("gate"))
    if stop:
        assert result.agents_run == (names[0],) and result.output == "first answer"
        assert seen.of("model") == [("one",)]
    else:
        assert result.agents_run == tuple(names) and result.output == "sent"


def test_a_second_gate_stops_after_the_first_let_the_pipeline_on(agent_runtime, scripted_llm, unique_name):
    """Gates on two stages: the first (Python) continues, the second (text) stops; the answer is stage two's."""
    seen = Seen()

    team, names = pipeline(scripted_llm, unique_name, seen, {"one": "first answer", "two": "DONE here", "three": "x"},
                           {"one": seen.gate(False), "two": Gate.text_contains("DONE")})
    result = agent_runtime.run(team, "Go.", timeout=120)
    assert result.status is RunStatus.COMPLETED, result.error
    assert result.agents_run == tuple(names[:2])
    assert result.output == "DONE here"
    assert seen.of("model") == [("one",), ("two",)]
    assert seen.of("gate") == [("first answer",)]


@pytest.mark.parametrize("how", ["raises", "not a bool"])
def test_a_python_gate_that_fails_fails_the_run(how, agent_runtime, scripted_llm, unique_name):
    """A gate function that raises, or returns something other than True or False, fails the run with why."""
    seen = Seen()

    def check(answer: str):
        seen.add("gate", answer)
        if how == "raises":
            raise RuntimeError("the gate broke")
        return "stop"

    team, names = pipeline(scripted_llm, unique_name, seen, {"one": "first answer", "two": "drafted", "three": "sent"},
                           {"one": Gate.function(check)})
    result = agent_runtime.run(team, "Go.", timeout=120)
    assert result.status is RunStatus.FAILED
    expected = "the gate broke" if how == "raises" else "returned 'stop'; it must return True"
    assert expected in (result.error or ""), result.error
    assert seen.of("model") == [("one",)]
    assert result.agents_run == (names[0],)


def test_a_stateful_teams_gate_runs_in_its_process(agent_runtime, scripted_llm, unique_name):
    """A stateful team: its gate task is on the run's domain, served here."""
    seen = Seen()

    team, names = pipeline(scripted_llm, unique_name, seen, {"one": "first answer", "two": "drafted", "three": "sent"},
                           {"one": seen.gate(True)}, stateful=True)
    handle = agent_runtime.start(team, "Go.")
    result = handle.wait(timeout=120)
    assert result.status is RunStatus.COMPLETED, result.error
    assert result.agents_run == (names[0],)
    assert seen.of("gate") == [("first answer",)]
    assert all(name.startswith("conductor-agents-tool") for name in seen.threads_of("gate"))
    tasks = agent_runtime._api.get_workflow(handle.execution_id, include_tasks=True)["tasks"]
    assert handle.run_id and {t.get("domain") for t in tasks if t.get("taskDefName") == gate_task_name(team.name, 0)} \
        == {handle.run_id}


def test_a_gate_in_a_stateful_trees_sub_team_runs_in_its_process(agent_runtime, scripted_llm, unique_name):
    """A stateful sequential team whose first stage is itself a sequential team with a Python gate: the gate
    task is in the sub-run, on the parent run's domain, served here; stopping ends only the sub-team."""
    seen = Seen()

    inner, names = pipeline(scripted_llm, unique_name, seen, {"one": "first answer", "two": "drafted", "three": "x"},
                            {"one": seen.gate(True)})
    closing = Agent(name=unique_name("closing"), model=scripted_llm.script(policy=lambda r: "closed"))
    outer = Agent(name=unique_name("outer"), model=scripted_llm.script(["never asked"]), agents=[inner, closing],
                  strategy="sequential", stateful=True)
    handle = agent_runtime.start(outer, "Go.")
    result = handle.wait(timeout=120)
    assert result.status is RunStatus.COMPLETED, result.error
    assert result.output == "closed"
    assert seen.of("gate") == [("first answer",)]
    assert seen.of("model") == [("one",)]
    assert all(name.startswith("conductor-agents-tool") for name in seen.threads_of("gate"))
    tasks = agent_runtime._api.get_workflow(handle.execution_id, include_tasks=True)["tasks"]
    [sub_run] = [t["subWorkflowId"] for t in tasks if t.get("referenceTaskName", "").endswith(inner.name)]
    sub_tasks = agent_runtime._api.get_workflow(sub_run, include_tasks=True)["tasks"]
    assert {t.get("domain") for t in sub_tasks if t.get("taskDefName") == gate_task_name(inner.name, 0)} \
        == {handle.run_id}
