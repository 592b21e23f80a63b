"""Gates between the stages of a sequential team: the value, where an Agent accepts one, the config it sends and
the worker body of a Python gate."""

from __future__ import annotations

import pytest

from conductor_agents import Agent, AgentDefinitionError, AgentTypeError, Gate, tool
from conductor_agents._common.task_names import gate_task_name

MODEL = "openai/gpt-4o"


def stage(name: str, gate=None, **kwargs) -> Agent:
    return Agent(name=name, model=MODEL, gate=gate, **kwargs)


def team(*stages: Agent, strategy="sequential", **kwargs) -> Agent:
    return Agent(name="team", model=MODEL, agents=list(stages), strategy=strategy, **kwargs)


def stop_on_x(text: str) -> bool:
    return "x" in text


class TestGateValue:
    def test_text_contains(self):
        gate = Gate.text_contains("STOP")
        assert (gate.kind, gate.text, gate.case_sensitive, gate.needs_worker) == ("text_contains", "STOP", True, False)
        assert gate.to_config() == {"type": "text_contains", "text": "STOP", "caseSensitive": True}
        assert Gate.text_contains("stop", case_sensitive=False).to_config()["caseSensitive"] is False

    def test_function(self):
        gate = Gate.function(stop_on_x)
        assert gate.needs_worker and gate.check is stop_on_x
        assert gate.to_config("t_gate_0") == {"taskName": "t_gate_0"}
        with pytest.raises(AgentDefinitionError, match="task name comes from the sequential team"):
            gate.to_config()

    def test_values_compare_and_hash(self):
        assert Gate.text_contains("a") == Gate.text_contains("a") != Gate.text_contains("a", case_sensitive=False)
        assert Gate.function(stop_on_x) == Gate.function(stop_on_x)
        assert hash(Gate.text_contains("a")) == hash(Gate.text_contains("a"))

    @pytest.mark.parametrize("bad, error, match", [
        (None, AgentTypeError, "needs a str"),
        (3, AgentTypeError, "needs a str"),
        ("", AgentDefinitionError, "non-empty"),
    ])
    def test_bad_text(self, bad, error, match):
        with pytest.raises(error, match=match) as info:
            Gate.text_contains(bad)
        assert info.value.field == "gate"

    def test_bad_case_sensitive(self):
        with pytest.raises(AgentTypeError, match="case_sensitive must be True or False"):
            Gate.text_contains("a", case_sensitive="yes")

    def test_bad_function(self):
        with pytest.raises(AgentTypeError, match="needs a callable"):
            Gate.function("stop")

    def test_kind_needs_its_field(self):
        with pytest.raises(AgentDefinitionError, match="needs check"):
            Gate("function")
        with pytest.raises(ValueError):
            Gate("regex", text="a")


class TestWhereAGateGoes:
    def test_not_a_gate(self):
        with pytest.raises(AgentTypeError, match="Agent.gate must be a Gate"):
            stage("one", gate="STOP")

    def test_a_sequential_stage_sends_its_gate(self):
        parent = team(stage("one", Gate.text_contains("NO")), stage("two", Gate.function(stop_on_x)), stage("three"))
        configs = parent.to_config()["agents"]
        assert configs[0]["gate"] == {"type": "text_contains", "text": "NO", "caseSensitive": True}
        assert configs[1]["gate"] == {"taskName": "team_gate_1"}
        assert "gate" not in configs[2]
        assert [t.name for t in parent.worker_tools] == ["team_gate_1"]  # the text gate needs no worker

    def test_a_stage_in_two_teams_gets_a_task_of_each(self):
        shared = stage("one", Gate.function(stop_on_x))
        a = Agent(name="a", model=MODEL, agents=[shared, stage("two")], strategy="sequential")
        b = Agent(name="b", model=MODEL, agents=[stage("zero"), shared, stage("two")], strategy="sequential")
        assert [t.name for t in a.worker_tools] == ["a_gate_0"]
        assert [t.name for t in b.worker_tools] == ["b_gate_1"]

    def test_the_gate_worker_is_served_with_the_tree(self):
        @tool
        def look(key: str) -> str:
            """Look."""
            return key

        inner = team(stage("one", Gate.function(stop_on_x), tools=[look]), stage("two"))
        outer = Agent(name="outer", model=MODEL, agents=[inner], strategy="handoff", stateful=True)
        assert {t.name for t in outer.worker_tools} == {"look", "team_gate_0"}
        assert outer.is_stateful and not inner.is_stateful

    def test_an_agent_run_alone_or_as_a_tool_refuses_its_gate(self):
        gated = stage("one", Gate.text_contains("NO"))
        with pytest.raises(AgentDefinitionError, match="only a stage of a sequential team runs") as info:
            gated.to_config()
        assert info.value.field == "gate"
        with pytest.raises(AgentDefinitionError, match="only a stage of a sequential team runs"):
            gated.as_tool()

    @pytest.mark.parametrize("strategy", ["handoff", "parallel", "round_robin", "router", "swarm"])
    def test_other_strategies_refuse_a_gate(self, strategy):
        with pytest.raises(AgentDefinitionError, match=f"only strategy='sequential' runs.*{strategy}"):
            team(stage("one", Gate.text_contains("NO")), stage("two"), strategy=strategy)

    def test_the_default_strategy_refuses_a_gate(self):
        with pytest.raises(AgentDefinitionError, match="'handoff'"):
            Agent(name="team", model=MODEL, agents=[stage("one", Gate.text_contains("NO")), stage("two")])

    def test_the_last_stage_refuses_a_gate(self):
        with pytest.raises(AgentDefinitionError, match="the last stage 'two' has a gate"):
            team(stage("one"), stage("two", Gate.text_contains("NO")))
        with pytest.raises(AgentDefinitionError, match="the last stage"):
            team(stage("one", Gate.function(stop_on_x)))

    def test_a_router_planner_or_fallback_refuses_a_gate(self):
        gated = stage("helper", Gate.text_contains("NO"))
        with pytest.raises(AgentDefinitionError, match="the router 'helper' has a gate"):
            team(stage("one"), stage("two"), strategy="router", router=gated)

        @tool
        def look(key: str) -> str:
            """Look."""
            return key

        with pytest.raises(AgentDefinitionError, match="the planner 'helper' has a gate"):
            Agent(name="coder", model=MODEL, tools=[look], strategy="plan_execute", planner=gated)
        with pytest.raises(AgentDefinitionError, match="the fallback 'helper' has a gate"):
            Agent(name="coder", model=MODEL, tools=[look], strategy="plan_execute", planner=stage("p"),
                  fallback=gated)

    def test_a_long_team_name_gets_a_short_task_name(self):
        name = "t" * 100
        assert len(gate_task_name(name, 3)) <= 64 and gate_task_name(name, 3).endswith("_gate_3")
        assert gate_task_name(name, 3) == gate_task_name(name, 3)


class TestGateWorker:
    def worker(self, check):
        parent = team(stage("one", Gate.function(check)), stage("two"))
        [worker] = parent.worker_tools
        return worker.func

    def test_stop_and_continue(self):
        body = self.worker(stop_on_x)
        assert body(result="an x") == {"result": {"decision": "stop"}}
        assert body(result="none") == {"result": {"decision": "continue"}}

    def test_it_gets_the_answer_as_text(self):
        seen = []
        body = self.worker(lambda text: seen.append(text) or False)
        body(result=None)
        body(result=42)
        body()
        assert seen == ["", "42", ""]

    def test_a_result_other_than_a_bool_is_an_error(self):
        body = self.worker(lambda text: "stop")
        with pytest.raises(TypeError, match="the gate after 'one' returned 'stop'; it must return True"):
            body(result="a")

    def test_an_exception_passes_through(self):
        def broken(text):
            raise RuntimeError("broken")

        with pytest.raises(RuntimeError, match="broken"):
            self.worker(broken)(result="a")
