"""Agents made of agents on the real server: agent tools, strategies, and a stateful tree pinned to its process."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from conductor_agents import Agent, AgentRuntime, InvalidAnswerError, RunStatus, Strategy, ToolContext, tool
from conductor_agents._common.task_names import handoff_task_name, router_task_name, selection_task_name
from conductor_agents.testing import ToolCall

pytestmark = pytest.mark.integration

MARKER = re.compile(r"run-[a-z]+-\d+")
#: How the server's final (synthesis) turn of a handoff or router parent starts its system prompt.
SYNTHESIS = "Based on the work done by the agents above"


class LookupTools:
    """A sub-agent's tool with per-instance state: which keys this instance looked up."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.keys: list = []
        self.lock = threading.Lock()

    @tool
    def lookup(self, key: str) -> dict:
        """Look a key up."""
        with self.lock:
            self.keys.append(key)
        return {"key": key, "by": self.label}


def marker_of(request) -> str:
    found = MARKER.search(request.user_text)
    assert found, f"no run marker in {request.user_text!r}"
    return found.group(0)


def specialist_policy(request):
    """Look the run's marker up once, then answer with what the tool said."""
    if request.is_first_turn:
        return ToolCall("lookup", {"key": marker_of(request)})
    [out] = request.tool_outputs
    return f"looked up {out.output['key']} by {out.output['by']}"


def coordinator_policy(specialist: str):
    """Hand off to ``specialist`` once, then DONE; the synthesis turn repeats the marker."""

    def policy(request):
        if SYNTHESIS in (request.instructions or ""):
            return f"final {marker_of(request)}"
        return "DONE" if f"[{specialist}]:" in request.user_text else specialist

    return policy


def caller_policy(tool_name: str):
    """Call the agent tool with the run's marker, then answer with its result."""

    def policy(request):
        if request.is_first_turn:
            return ToolCall(tool_name, {"request": f"look up {marker_of(request)}"})
        [out] = request.tool_outputs
        return f"final {marker_of(request)}: {json.dumps(out.output)}"

    return policy


def team(kind: str, names: dict, models: dict, tools: LookupTools) -> Agent:
    """A stateful parent whose sub-agent's tool is ``tools.lookup``: through a handoff or an agent tool."""
    specialist = Agent(name=names["specialist"], model=models["specialist"], tools=[tools.lookup],
                       instructions="Look things up.", description="looks things up")
    if kind == "handoff":
        other = Agent(name=names["other"], model=models["other"], instructions="Idle.", description="never asked")
        return Agent(name=names["parent"], model=models["parent"], stateful=True, agents=[specialist, other],
                     strategy=Strategy.HANDOFF, instructions="Route.")
    return Agent(name=names["parent"], model=models["parent"], stateful=True, instructions="Delegate.",
                 tools=[specialist.as_tool(name="ask_specialist", description="Ask the specialist.")])


def team_models(scripted_llm, kind: str, names: dict) -> dict:
    models = {"specialist": scripted_llm.script(policy=specialist_policy)}
    if kind == "handoff":
        models["parent"] = scripted_llm.script(policy=coordinator_policy(names["specialist"]))
        models["other"] = scripted_llm.script(["never asked"])
    else:
        models["parent"] = scripted_llm.script(policy=caller_policy("ask_specialist"))
    return models


CHILD = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, {root!r})
    from conductor_agents import AgentRuntime, AgentSettings
    from tests.integration.test_subagents import LookupTools, team
    tools = LookupTools("child")
    agent = team({kind!r}, {names!r}, {models!r}, tools)
    with AgentRuntime(AgentSettings(server_url={url!r})) as runtime:
        handles = [runtime.start(agent, f"Please handle run-child-{{i}}.") for i in range({runs})]
        print(json.dumps({{"started": [h.execution_id for h in handles]}}), flush=True)
        results = [h.wait(timeout=240) for h in handles]
        print(json.dumps({{"statuses": [r.status.value for r in results], "outputs": [r.output for r in results],
                          "keys": tools.keys, "pid_runs": len(handles)}}), flush=True)
    """
)


@pytest.mark.both_topologies
@pytest.mark.parametrize("kind", ["handoff", "agent_tool"])
def test_a_stateful_tree_runs_its_sub_agents_tools_in_its_own_process(kind, agent_runtime, agent_settings,
                                                                      scripted_llm, unique_name):
    """Runs of one stateful team here and in a child process at once: each sub-agent tool call lands
    in the process that started its run (zero crossovers), and the result says who answered."""
    names = {role: unique_name(role) for role in ("parent", "specialist", "other")}
    models = team_models(scripted_llm, kind, names)
    runs = 3
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    code = CHILD.format(root=root, kind=kind, names=names, models=models, url=agent_settings.server_url, runs=runs)
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        started = json.loads(child.stdout.readline())["started"]
        tools_here = LookupTools("parent")
        agent = team(kind, names, models, tools_here)
        handles = [agent_runtime.start(agent, f"Please handle run-parent-{i}.") for i in range(runs)]
        results = [h.wait(timeout=240) for h in handles]
        out, _ = child.communicate(timeout=240)
        report = json.loads(out.strip().splitlines()[-1])
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=10)
    assert len(started) == runs
    assert [r.status for r in results] == [RunStatus.COMPLETED] * runs
    assert report["statuses"] == ["COMPLETED"] * runs
    assert sorted(tools_here.keys) == [f"run-parent-{i}" for i in range(runs)]
    assert sorted(report["keys"]) == [f"run-child-{i}" for i in range(runs)]
    for i, result in enumerate(results):
        assert result.output.startswith(f"final run-parent-{i}")
        if kind == "handoff":
            assert result.agents_run == (names["specialist"],)
            assert result.answered_by == names["specialist"]
        else:
            [call] = result.tool_calls
            assert call.name == "ask_specialist" and call.status == "COMPLETED"
            assert call.arguments == {"prompt": f"look up run-parent-{i}"}
            assert f"looked up run-parent-{i} by parent" in call.output["result"]
            assert result.answered_by is None
    for i, output in enumerate(report["outputs"]):
        assert output.startswith(f"final run-child-{i}")
    scripted_llm.assert_no_anomalies(models["specialist"])
    scripted_llm.assert_no_anomalies(models["parent"])


def test_a_stateless_agent_tool_runs_the_sub_agents_tool_here(agent_runtime, scripted_llm, unique_name):
    """Without a domain the sub-agent's tool is served by the shared poller of this runtime."""
    tools = LookupTools("here")
    specialist = Agent(name=unique_name("specialist"), model=scripted_llm.script(policy=specialist_policy),
                       tools=[tools.lookup])
    parent = Agent(name=unique_name("caller"), model=scripted_llm.script(policy=caller_policy("ask")),
                   tools=[specialist.as_tool(name="ask")])
    result = agent_runtime.run(parent, "Please handle run-solo-1.", timeout=120)
    assert result.status is RunStatus.COMPLETED, result.error
    assert tools.keys == ["run-solo-1"]
    assert result.output.startswith("final run-solo-1")


@pytest.mark.parametrize("strategy", ["sequential", "parallel", "round_robin"])
def test_fixed_order_strategies_record_which_agents_answered(strategy, agent_runtime, scripted_llm, unique_name):
    """sequential, parallel and round_robin run their sub-agents without a coordinator; agents_run says which ran."""
    first = Agent(name=unique_name("first"), model=scripted_llm.script(policy=lambda r: "first says hi"))
    second = Agent(name=unique_name("second"), model=scripted_llm.script(policy=lambda r: "second says hi"))
    parent = Agent(name=unique_name("team"), model=scripted_llm.script(["unused"]), agents=[first, second],
                   strategy=strategy, max_turns=2)
    result = agent_runtime.run(parent, "Say hi.", timeout=120)
    assert result.status is RunStatus.COMPLETED, result.error
    assert sorted(result.agents_run) == sorted([first.name, second.name])
    if strategy == "sequential":
        assert result.agents_run == (first.name, second.name)
        assert result.answered_by == second.name and result.output == "second says hi"
    if strategy == "parallel":
        assert "first says hi" in result.output and "second says hi" in result.output


def test_a_router_agent_picks_the_sub_agent(agent_runtime, scripted_llm, unique_name):
    """strategy='router': the router agent's model names the sub-agent; the parent writes the answer."""
    billing = Agent(name=unique_name("billing"), model=scripted_llm.script(["the bill is 42"]))
    tech = Agent(name=unique_name("tech"), model=scripted_llm.script(["never asked"]))
    router = Agent(name=unique_name("router"), model=scripted_llm.script([billing.name, "DONE"]))
    parent = Agent(name=unique_name("desk"), model=scripted_llm.script(["Your bill is 42."]), agents=[billing, tech],
                   strategy="router", router=router)
    result = agent_runtime.run(parent, "How much do I owe?", timeout=120)
    assert result.status is RunStatus.COMPLETED, result.error
    assert result.agents_run == (billing.name,)
    assert result.output == "Your bill is 42."


def test_a_swarm_passes_the_conversation_by_transfer_tool(agent_runtime, scripted_llm, unique_name):
    """strategy='swarm': the server offers the parent '<parent>_transfer_to_<peer>' tools; calling one hands over."""
    name = unique_name("swarm")
    billing = Agent(name=unique_name("billing"), model=scripted_llm.script(["the bill is 42"]))
    tech = Agent(name=unique_name("tech"), model=scripted_llm.script(["never asked"]))
    model = scripted_llm.script([ToolCall(f"{name}_transfer_to_{billing.name}", {}), "Your bill is 42."])
    parent = Agent(name=name, model=model, agents=[billing, tech], strategy="swarm")
    result = agent_runtime.run(parent, "How much do I owe?", timeout=120)
    assert result.status is RunStatus.COMPLETED, result.error
    assert result.agents_run == (billing.name,)
    assert scripted_llm.requests_for(model)[0].tools == (f"{name}_transfer_to_{billing.name}",
                                                       f"{name}_transfer_to_{tech.name}")
    assert result.output == "Your bill is 42."


def test_a_termination_condition_ends_a_round_robin(agent_runtime, scripted_llm, unique_name):
    """termination=text_mention('DONE') | max_messages(6): the second speaker says DONE, the loop ends there."""
    from conductor_agents import Termination

    first = Agent(name=unique_name("first"), model=scripted_llm.script(policy=lambda r: "still working"))
    second = Agent(name=unique_name("second"), model=scripted_llm.script(policy=lambda r: "DONE here"))
    parent = Agent(name=f"rr_{os.getpid()}_{unique_name('t')[-7:]}", model=scripted_llm.script(["unused"]),
                   agents=[first, second], strategy="round_robin", max_turns=10,
                   termination=Termination.text_mention("DONE") | Termination.max_messages(6))
    result = agent_runtime.run(parent, "Take turns.", timeout=120)
    assert result.status is RunStatus.COMPLETED, result.error
    assert result.answered_by == second.name
    assert len(result.agents_run) <= 2


def test_a_swarm_text_mention_handoff(agent_runtime, scripted_llm, unique_name):
    """Handoff.on_text_mention: the parent's answer names the cue, and the conversation passes to the target."""
    from conductor_agents import Handoff

    billing = Agent(name=unique_name("billing"), model=scripted_llm.script(["the bill is 42"]))
    tech = Agent(name=unique_name("tech"), model=scripted_llm.script(["never asked"]))
    model = scripted_llm.script(["Passing you to BILLING-DESK now.", "Your bill is 42."])
    parent = Agent(name=unique_name("swarm"), model=model, agents=[billing, tech], strategy="swarm",
                   handoffs=[Handoff.on_text_mention(billing.name, "BILLING-DESK")])
    result = agent_runtime.run(parent, "How much do I owe?", timeout=120)
    assert result.status is RunStatus.COMPLETED, result.error
    assert result.agents_run == (billing.name,)


class Patient:
    """A sub-agent's tool that waits (bounded) for its run to be stopped or cancelled, and says which."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.saw: list = []

    @tool
    def wait_around(self, ctx: ToolContext) -> str:
        """Wait for news."""
        self.entered.set()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if ctx.cancelled.is_set():
                self.saw.append(("cancelled", ctx.execution_id))
                return "cancelled"
            if ctx.stop_requested.is_set():
                self.saw.append(("stop", ctx.execution_id))
                return "stopping"
            ctx.cancelled.wait(0.05)
        self.saw.append(("timeout", ctx.execution_id))
        return "timed out"


@pytest.mark.parametrize("how", ["stop", "cancel"])
def test_stop_and_cancel_reach_a_sub_agents_tool(how, agent_runtime, scripted_llm, unique_name):
    """handle.stop() / cancel() of the parent: the sub-agent's tool running here sees stop_requested / cancelled."""
    patient = Patient()
    names = {role: unique_name(role) for role in ("parent", "specialist")}

    def coordinator(request):
        if SYNTHESIS in (request.instructions or ""):
            return "final"
        return "DONE" if f"[{names['specialist']}]:" in request.user_text else names["specialist"]

    def specialist(request):
        return ToolCall("wait_around", {}) if request.is_first_turn else "done waiting"

    sub = Agent(name=names["specialist"], model=scripted_llm.script(policy=specialist), tools=[patient.wait_around])
    parent = Agent(name=names["parent"], model=scripted_llm.script(policy=coordinator), stateful=True, agents=[sub])
    handle = agent_runtime.start(parent, "Wait.")
    assert patient.entered.wait(60), "the sub-agent's tool did not start"
    getattr(handle, how)()
    result = handle.wait(timeout=90)
    assert [kind for kind, _ in patient.saw] == ["stop" if how == "stop" else "cancelled"]
    [(_, sub_run)] = patient.saw
    assert sub_run != handle.execution_id  # the tool ran in the sub-run
    assert result.status is (RunStatus.COMPLETED if how == "stop" else RunStatus.TERMINATED)


class Calls:
    """What a Python router or handoff condition was asked, and on which thread (bounded, thread-safe)."""

    def __init__(self) -> None:
        self.seen: list = []
        self.lock = threading.Lock()

    def add(self, item) -> None:
        with self.lock:
            self.seen.append((item, threading.current_thread().name))

    @property
    def items(self) -> list:
        with self.lock:
            return [item for item, _ in self.seen]

    def assert_ran_in_tool_threads(self) -> None:
        with self.lock:
            assert self.seen and all(name.startswith("conductor-agents-tool") for _, name in self.seen), self.seen


def domains_of(agent_runtime, execution_id: str, task_name: str) -> set:
    tasks = agent_runtime._api.get_workflow(execution_id, include_tasks=True)["tasks"]
    return {t.get("domain") for t in tasks if t.get("taskDefName") == task_name}


def function_router_team(scripted_llm, unique_name, calls: Calls, *, stateful: bool, tools: LookupTools = None):
    """A router team whose router is Python: the first sub-agent that has not answered yet, then DONE."""
    names = {role: unique_name(role) for role in ("desk", "billing", "tech")}
    billing = Agent(name=names["billing"], model=scripted_llm.script(policy=lambda r: "the bill is 42"),
                    description="Billing.")
    tech_tools = [tools.lookup] if tools is not None else []
    tech = Agent(name=names["tech"], model=scripted_llm.script(policy=specialist_policy if tools else
                                                               (lambda r: "tech says hi")),
                 tools=tech_tools, description="Tech.")

    def route(conversation: str) -> str:
        calls.add(conversation)
        for name in (names["tech"], names["billing"]):
            if f"[{name}]:" not in conversation:
                return name
        return "DONE"

    parent_model = scripted_llm.script(policy=lambda r: f"final {marker_of(r)}" if MARKER.search(r.user_text)
                                       else "final")
    return Agent(name=names["desk"], model=parent_model, agents=[billing, tech], strategy="router", router=route,
                 stateful=stateful), names


def test_a_python_router_picks_the_sub_agents(agent_runtime, scripted_llm, unique_name):
    """router=<callable>: the server asks the function (a worker task here) with the conversation; it names
    the next sub-agent until it says DONE, and the parent writes the answer."""
    calls = Calls()
    parent, names = function_router_team(scripted_llm, unique_name, calls, stateful=False)
    result = agent_runtime.run(parent, "Please handle run-route-1.", timeout=120)
    assert result.status is RunStatus.COMPLETED, result.error
    assert result.agents_run == (names["tech"], names["billing"])
    assert result.output == "final run-route-1"
    seen = calls.items
    assert len(seen) == 3 and all("run-route-1" in text for text in seen)
    assert f"[{names['tech']}]:" in seen[1] and "tech says hi" in seen[1]
    assert f"[{names['billing']}]:" in seen[2] and "the bill is 42" in seen[2]
    calls.assert_ran_in_tool_threads()


def test_a_python_router_that_names_no_sub_agent_fails_the_run(agent_runtime, scripted_llm, unique_name):
    """A router answer that names no sub-agent fails the run with the names it could have used (the server
    alone would end the loop silently)."""
    billing = Agent(name=unique_name("billing"), model=scripted_llm.script(["never asked"]))
    parent = Agent(name=unique_name("desk"), model=scripted_llm.script(["never asked"]), agents=[billing],
                   strategy="router", router=lambda conversation: "nobody")
    result = agent_runtime.run(parent, "Route me.", timeout=120)
    assert result.status is RunStatus.FAILED
    assert "the router returned 'nobody'" in (result.error or "")
    assert result.agents_run == ()


@pytest.mark.both_topologies
def test_a_stateful_python_router_runs_in_its_process(topology, agent_runtime, scripted_llm, unique_name):
    """A stateful router team: the router task and the sub-agent's tool are on the run's domain, served here."""
    calls = Calls()
    tools = LookupTools("here")
    parent, names = function_router_team(scripted_llm, unique_name, calls, stateful=True, tools=tools)
    handle = agent_runtime.start(parent, "Please handle run-route-2.")
    result = handle.wait(timeout=180)
    assert result.status is RunStatus.COMPLETED, result.error
    assert result.agents_run == (names["tech"], names["billing"])
    assert tools.keys == ["run-route-2"]
    assert len(calls.items) == 3
    calls.assert_ran_in_tool_threads()
    assert handle.run_id and domains_of(agent_runtime, handle.execution_id, router_task_name(names["desk"])) == \
        {handle.run_id}


def condition_swarm(scripted_llm, unique_name, calls: Calls, *, stateful: bool):
    """A swarm whose parent answers 'please refund'; a Python condition hands that to billing, another
    (never true) would hand it to tech."""
    from conductor_agents import Handoff

    names = {role: unique_name(role) for role in ("swarm", "billing", "tech")}
    billing = Agent(name=names["billing"], model=scripted_llm.script(policy=lambda r: "refund sent"))
    tech = Agent(name=names["tech"], model=scripted_llm.script(["never asked"]))

    def to_billing(ctx) -> bool:
        calls.add(("billing", ctx.agent, ctx.result))
        return "refund" in ctx.result.lower()

    def to_tech(ctx) -> bool:
        calls.add(("tech", ctx.agent, ctx.result))
        return False

    parent = Agent(name=names["swarm"], model=scripted_llm.script(policy=lambda r: "Please refund me."),
                   agents=[billing, tech], strategy="swarm", stateful=stateful, max_turns=6,
                   handoffs=[Handoff.on_condition(names["tech"], to_tech),
                             Handoff.on_condition(names["billing"], to_billing)])
    return parent, names


def check_condition_calls(calls: Calls, names: dict) -> None:
    seen = calls.items
    # after the parent's turn both conditions are asked; after billing's only tech's (billing's own
    # condition never hands billing the conversation it has)
    assert ("tech", names["swarm"], "Please refund me.") in seen
    assert ("billing", names["swarm"], "Please refund me.") in seen
    assert ("tech", names["billing"], "refund sent") in seen
    assert not [c for c in seen if c[0] == "billing" and c[1] == names["billing"]]
    assert len(seen) == 3, seen
    calls.assert_ran_in_tool_threads()


def test_an_on_condition_handoff_decides_in_python(agent_runtime, scripted_llm, unique_name):
    """Handoff.on_condition: the server asks the Python condition after each turn; true hands the
    conversation to its target, and once no rule matches the swarm ends."""
    calls = Calls()
    parent, names = condition_swarm(scripted_llm, unique_name, calls, stateful=False)
    result = agent_runtime.run(parent, "I was charged twice.", timeout=120)
    assert result.status is RunStatus.COMPLETED, result.error
    assert result.agents_run == (names["billing"],)
    check_condition_calls(calls, names)


@pytest.mark.both_topologies
def test_a_stateful_swarms_conditions_run_in_its_process(topology, agent_runtime, scripted_llm, unique_name):
    """A stateful swarm: its condition tasks are on the run's domain and run here."""
    calls = Calls()
    parent, names = condition_swarm(scripted_llm, unique_name, calls, stateful=True)
    handle = agent_runtime.start(parent, "I was charged twice.")
    result = handle.wait(timeout=180)
    assert result.status is RunStatus.COMPLETED, result.error
    assert result.agents_run == (names["billing"],)
    check_condition_calls(calls, names)
    assert handle.run_id
    for index in (0, 1):
        assert domains_of(agent_runtime, handle.execution_id, handoff_task_name(names["swarm"], index)) == \
            {handle.run_id}


def next_pick(handle, after: set, timeout: float = 60):
    """The pick the run waits on now that is none of ``after`` (task ids), bounded."""
    from ..helpers import eventually

    picks = eventually(lambda: [r for r in handle.pending() if r.options and r.task_id not in after],
                       timeout=timeout, interval=0.2, message="a pick of the next agent")
    assert len(picks) == 1, picks
    return picks[0]


def run_manual_team(agent_runtime, scripted_llm, unique_name, *, stateful: bool):
    """A manual team of two: a person picks billing (by name), then tech (by Agent); max_turns=2 ends it."""
    tools = LookupTools("here")
    names = {role: unique_name(role) for role in ("billing", "tech")}
    # the server names the selection task after the team: at most 46 characters (and a '-' to see it mapped)
    names["desk"] = f"desk-{os.getpid()}-{unique_name('m')[-7:]}"
    billing = Agent(name=names["billing"], model=scripted_llm.script(policy=lambda r: "the bill is 42"))
    tech = Agent(name=names["tech"], model=scripted_llm.script(policy=specialist_policy), tools=[tools.lookup])
    team = Agent(name=names["desk"], model=scripted_llm.script(["never asked"]), agents=[billing, tech],
                 strategy="manual", max_turns=2, stateful=stateful)
    handle = agent_runtime.start(team, "Please handle run-manual-1.")
    try:
        return check_manual_run(handle, names, tech, tools)
    finally:
        if not handle.status().is_terminal:
            handle.cancel("the test failed")


def check_manual_run(handle, names: dict, tech: Agent, tools: LookupTools):
    first = next_pick(handle, set())
    assert first.options == (names["billing"], names["tech"])
    assert "run-manual-1" in first.arguments["conversation"]
    with pytest.raises(InvalidAnswerError, match="must be one of"):
        handle.respond("nobody")
    taken = handle.respond(names["billing"], by="pat")
    assert (taken.answer, taken.answered_by) == (names["billing"], "pat")
    second = next_pick(handle, {first.task_id})
    assert "the bill is 42" in second.arguments["conversation"]
    handle.respond(tech)
    result = handle.wait(timeout=120)
    assert result.status is RunStatus.COMPLETED, result.error
    assert result.agents_run == (names["billing"], names["tech"])
    assert "the bill is 42" in result.output and "looked up run-manual-1 by here" in result.output
    assert tools.keys == ["run-manual-1"]
    assert handle.pending() == ()
    return handle, names


def test_a_person_picks_each_turns_agent_of_a_manual_team(agent_runtime, scripted_llm, unique_name):
    """strategy='manual': each turn waits for a person (handle.pending(): a question with the sub-agents as
    options); handle.respond(name) runs that sub-agent; a name that is no sub-agent's is refused unsent."""
    run_manual_team(agent_runtime, scripted_llm, unique_name, stateful=False)


@pytest.mark.both_topologies
def test_a_stateful_manual_team_serves_its_selection_here(topology, agent_runtime, scripted_llm, unique_name):
    """A stateful manual team: the selection task and the sub-agent's tool are on the run's domain, served here."""
    handle, names = run_manual_team(agent_runtime, scripted_llm, unique_name, stateful=True)
    assert handle.run_id
    task = selection_task_name(names["desk"])
    assert task == re.sub(r"[^A-Za-z0-9_]", "_", names["desk"]) + "_process_selection"
    assert domains_of(agent_runtime, handle.execution_id, task) == {handle.run_id}


class MarkerCalls:
    """The run markers a Python router or handoff condition saw in this process (thread-safe)."""

    def __init__(self) -> None:
        self.markers: list = []
        self.lock = threading.Lock()

    def saw(self, text: str) -> None:
        found = MARKER.search(text)
        with self.lock:
            self.markers.append(found.group(0) if found else None)


def python_decided_team(kind: str, names: dict, models: dict, tools: LookupTools, calls: MarkerCalls) -> Agent:
    """A stateful team whose next agent a Python function picks: a router (``kind="router"``) or a swarm's
    on_condition handoff (``"swarm"``); the picked sub-agent's tool is ``tools.lookup``."""
    from conductor_agents import Handoff

    billing = Agent(name=names["billing"], model=models["billing"], tools=[tools.lookup], description="Billing.")
    tech = Agent(name=names["tech"], model=models["tech"], description="Tech.")
    if kind == "router":
        def route(conversation: str) -> str:
            calls.saw(conversation)
            return "DONE" if f"[{names['billing']}]:" in conversation else names["billing"]

        return Agent(name=names["parent"], model=models["parent"], agents=[billing, tech], strategy="router",
                     router=route, stateful=True)

    def to_billing(ctx) -> bool:
        calls.saw(ctx.conversation)
        return "refund" in ctx.result

    return Agent(name=names["parent"], model=models["parent"], agents=[billing, tech], strategy="swarm",
                 handoffs=[Handoff.on_condition(names["billing"], to_billing)], stateful=True, max_turns=6)


CHILD_DECIDED = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, {root!r})
    from conductor_agents import AgentRuntime, AgentSettings
    from tests.integration.test_subagents import LookupTools, MarkerCalls, python_decided_team
    tools, calls = LookupTools("child"), MarkerCalls()
    agent = python_decided_team({kind!r}, {names!r}, {models!r}, tools, calls)
    with AgentRuntime(AgentSettings(server_url={url!r})) as runtime:
        handles = [runtime.start(agent, f"Please handle run-child-{{i}}.") for i in range({runs})]
        print(json.dumps({{"started": [h.execution_id for h in handles]}}), flush=True)
        results = [h.wait(timeout=240) for h in handles]
        print(json.dumps({{"statuses": [r.status.value for r in results], "keys": tools.keys,
                          "markers": calls.markers}}), flush=True)
    """
)


@pytest.mark.both_topologies
@pytest.mark.parametrize("kind", ["router", "swarm"])
def test_python_routing_of_a_stateful_team_stays_in_each_process(kind, topology, agent_runtime, agent_settings,
                                                                  scripted_llm, unique_name):
    """Runs of one stateful team whose next agent a Python router / on_condition handoff picks, here and in a
    child process at once: every router or condition call and every sub-agent tool call lands in the process
    that started its run (zero crossovers)."""
    names = {role: unique_name(role) for role in ("parent", "billing", "tech")}
    parent_policy = ((lambda r: f"final {marker_of(r)}") if kind == "router"
                     else (lambda r: f"refund {marker_of(r)}"))
    models = {"parent": scripted_llm.script(policy=parent_policy),
              "billing": scripted_llm.script(policy=specialist_policy),
              "tech": scripted_llm.script(["never asked"])}
    runs = 3
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    code = CHILD_DECIDED.format(root=root, kind=kind, names=names, models=models, url=agent_settings.server_url,
                                runs=runs)
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        started = json.loads(child.stdout.readline())["started"]
        tools, calls = LookupTools("parent"), MarkerCalls()
        agent = python_decided_team(kind, names, models, tools, calls)
        handles = [agent_runtime.start(agent, f"Please handle run-parent-{i}.") for i in range(runs)]
        results = [h.wait(timeout=240) for h in handles]
        out, _ = child.communicate(timeout=240)
        report = json.loads(out.strip().splitlines()[-1])
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=10)
    assert len(started) == runs
    assert [r.status for r in results] == [RunStatus.COMPLETED] * runs, [r.error for r in results]
    assert report["statuses"] == ["COMPLETED"] * runs
    assert [r.agents_run for r in results] == [(names["billing"],)] * runs
    assert sorted(tools.keys) == [f"run-parent-{i}" for i in range(runs)]
    assert sorted(report["keys"]) == [f"run-child-{i}" for i in range(runs)]
    # a router is asked twice per run (billing, then DONE); a condition once per turn of the parent
    # (billing's own turn does not ask its own condition)
    per_run = 2 if kind == "router" else 1
    assert sorted(calls.markers) == sorted(f"run-parent-{i}" for i in range(runs) for _ in range(per_run))
    assert sorted(report["markers"]) == sorted(f"run-child-{i}" for i in range(runs) for _ in range(per_run))
    scripted_llm.assert_no_anomalies(models["billing"])


# ── plan_execute: a planner's JSON plan of the parent's tools, run by the server, with a fallback ──────────


def plan_text(steps: list) -> str:
    """A planner's answer: some prose, then the plan in a ```json fence (what the server extracts)."""
    return "Here is my plan.\n\n```json\n" + json.dumps({"steps": steps}) + "\n```"


def lookup_step(step_id: str, *keys: str, depends_on=None) -> dict:
    step = {"id": step_id, "operations": [{"tool": "lookup", "args": {"key": key}} for key in keys]}
    if len(keys) > 1:
        step["parallel"] = True
    if depends_on:
        step["depends_on"] = depends_on
    return step


def planner_policy(make_steps):
    """Plan from the run's marker: ``make_steps(marker)`` is the plan's steps."""

    def policy(request):
        return plan_text(make_steps(marker_of(request)))

    return policy


def plan_sub_run_tasks(agent_runtime, execution_id: str, agent_name: str) -> list:
    """The tasks of the plan's sub-workflow (``pe_<agent>_plan``) of a plan_execute run."""
    tasks = agent_runtime._api.get_workflow(execution_id, include_tasks=True)["tasks"]
    [plan] = [t for t in tasks if t.get("taskType") == "SUB_WORKFLOW" and t.get("taskDefName") ==
              f"pe_{agent_name}_plan"]
    return agent_runtime._api.get_workflow(plan["subWorkflowId"], include_tasks=True)["tasks"]


def test_a_planners_plan_runs_the_parents_tools(agent_runtime, scripted_llm, unique_name):
    """strategy='plan_execute': the planner sees the prompt, the server's list of the parent's tools and its plan
    schema, and answers with a JSON plan; the server runs it (a parallel step, then a step after it) as the
    parent's tools, served here; the run's answer is the last step's output; agents_run names the planner."""
    tools = LookupTools("here")
    planner = Agent(name=unique_name("planner"), instructions="Plan the lookups.",
                    model=scripted_llm.script(policy=planner_policy(lambda m: [
                        lookup_step("both", f"{m}-a", f"{m}-b"),
                        lookup_step("last", f"{m}-c", depends_on=["both"])])))
    parent = Agent(name=unique_name("coder"), model=scripted_llm.script(["never asked"]), tools=[tools.lookup],
                   strategy="plan_execute", planner=planner)
    result = agent_runtime.run(parent, "Please look up run-plan-1.", timeout=180)
    assert result.status is RunStatus.COMPLETED, result.error
    assert sorted(tools.keys[:2]) == ["run-plan-1-a", "run-plan-1-b"] and tools.keys[2:] == ["run-plan-1-c"]
    assert json.loads(result.output) == {"key": "run-plan-1-c", "by": "here"}
    assert result.agents_run == (planner.name,) and result.answered_by == planner.name
    [request] = scripted_llm.requests_for(planner.model)
    assert "Please look up run-plan-1." in request.user_text
    assert "## Available tools" in request.user_text and "`lookup`" in request.user_text
    assert "## Plan schema" in request.user_text
    steps = [t for t in plan_sub_run_tasks(agent_runtime, result.execution_id, parent.name)
             if t.get("taskDefName") == "lookup"]
    assert len(steps) == 3 and {t["status"] for t in steps} == {"COMPLETED"}
    assert scripted_llm.requests_for(parent.model) == ()


def test_a_plan_that_does_not_compile_goes_to_the_fallback(agent_runtime, scripted_llm, unique_name):
    """A plan naming a tool the parent does not have fails PLAN_AND_COMPILE; the fallback agent gets the prompt
    and the planner's text, and its answer (after a tool call of its own) is the run's. The server (3.32.3) means
    to add the compiler's error but its script serialises it as '{}': the error is on the compile task only."""
    tools = LookupTools("fallback")
    planner = Agent(name=unique_name("planner"), model=scripted_llm.script(policy=lambda r: plan_text(
        [{"id": "oops", "operations": [{"tool": "ghost", "args": {"key": "x"}}]}])))

    def fallback_policy(request):
        if request.is_first_turn:
            return ToolCall("lookup", {"key": marker_of(request)})
        return f"recovered {request.tool_outputs[0].output['key']}"

    fallback = Agent(name=unique_name("fixer"), model=scripted_llm.script(policy=fallback_policy),
                     tools=[tools.lookup], instructions="Do it yourself.")
    parent = Agent(name=unique_name("coder"), model=scripted_llm.script(["never asked"]), tools=[tools.lookup],
                   strategy="plan_execute", planner=planner, fallback=fallback, fallback_max_turns=3)
    result = agent_runtime.run(parent, "Please look up run-plan-2.", timeout=180)
    assert result.status is RunStatus.COMPLETED, result.error
    assert result.output == "recovered run-plan-2"
    assert tools.keys == ["run-plan-2"]
    assert result.agents_run == (planner.name, fallback.name) and result.answered_by == fallback.name
    first = scripted_llm.requests_for(fallback.model)[0]
    assert "Please look up run-plan-2." in first.user_text and "Plan:" in first.user_text
    assert "Execution errors:\n{}" in first.user_text and "ghost" in first.user_text  # the plan's text
    [compiled] = [t for t in agent_runtime._api.get_workflow(result.execution_id, include_tasks=True)["tasks"]
                  if t.get("taskType") == "PLAN_AND_COMPILE"]
    assert "unknown tool 'ghost'" in compiled["outputData"]["error"]


def test_a_plan_whose_step_fails_goes_to_the_fallback(agent_runtime, scripted_llm, unique_name):
    """A step's tool raising fails the plan's sub-workflow; the fallback answers instead."""
    calls = []

    @tool
    def fragile(key: str) -> dict:
        """Fails on purpose."""
        calls.append(key)
        raise RuntimeError(f"cannot look up {key}")

    planner = Agent(name=unique_name("planner"), model=scripted_llm.script(policy=lambda r: plan_text(
        [{"id": "try", "operations": [{"tool": "fragile", "args": {"key": marker_of(r)}}]}])))
    fallback = Agent(name=unique_name("fixer"), model=scripted_llm.script(policy=lambda r: "fallback answer"))
    parent = Agent(name=unique_name("coder"), model=scripted_llm.script(["never asked"]), tools=[fragile],
                   strategy="plan_execute", planner=planner, fallback=fallback)
    result = agent_runtime.run(parent, "Please look up run-plan-3.", timeout=240)
    assert result.status is RunStatus.COMPLETED, result.error
    assert result.output == "fallback answer"
    assert calls and set(calls) == {"run-plan-3"}
    assert result.agents_run == (planner.name, fallback.name)
    [request] = scripted_llm.requests_for(fallback.model)
    assert "Execution errors:" in request.user_text


def test_an_answer_without_a_plan_goes_to_the_fallback(agent_runtime, scripted_llm, unique_name):
    """A planner answer with no JSON plan skips the plan; the fallback gets the prompt and the planner's text."""
    tools = LookupTools("here")
    planner = Agent(name=unique_name("planner"), model=scripted_llm.script(["I would rather not plan."]))
    fallback = Agent(name=unique_name("fixer"), model=scripted_llm.script(policy=lambda r: "did it without a plan"))
    parent = Agent(name=unique_name("coder"), model=scripted_llm.script(["never asked"]), tools=[tools.lookup],
                   strategy="plan_execute", planner=planner, fallback=fallback)
    result = agent_runtime.run(parent, "Please look up run-plan-6.", timeout=180)
    assert result.status is RunStatus.COMPLETED, result.error
    assert result.output == "did it without a plan" and tools.keys == []
    assert result.agents_run == (planner.name, fallback.name)
    [request] = scripted_llm.requests_for(fallback.model)
    assert "Please look up run-plan-6." in request.user_text
    assert "Planner output:" in request.user_text and "I would rather not plan." in request.user_text


def test_a_plan_that_does_not_compile_without_a_fallback_fails_the_run(agent_runtime, scripted_llm, unique_name):
    """Without a fallback a bad plan ends the run FAILED with the compiler's error."""
    tools = LookupTools("here")
    planner = Agent(name=unique_name("planner"), model=scripted_llm.script(policy=lambda r: plan_text(
        [{"id": "oops", "operations": [{"tool": "ghost", "args": {"key": "x"}}]}])))
    parent = Agent(name=unique_name("coder"), model=scripted_llm.script(["never asked"]), tools=[tools.lookup],
                   strategy="plan_execute", planner=planner)
    result = agent_runtime.run(parent, "Please look up run-plan-4.", timeout=180)
    assert result.status is RunStatus.FAILED
    assert "Plan compilation failed" in (result.error or "") and "ghost" in result.error
    assert tools.keys == []


@pytest.mark.both_topologies
def test_a_stateful_plan_runs_its_tools_in_its_process(topology, agent_runtime, scripted_llm, unique_name):
    """A stateful plan_execute team: the planner's own tool and the plan's steps (in the plan's sub-workflow)
    are on the run's domain and run here, on this process's tool threads, with this instance's state."""
    calls = Calls()

    @tool
    def survey(topic: str) -> str:
        """What is there to look up."""
        calls.add(("survey", topic))
        return f"keys for {topic}: -a"

    tools = LookupTools("here")

    def plan_policy(request):
        if request.is_first_turn:
            return ToolCall("survey", {"topic": marker_of(request)})
        return plan_text([lookup_step("only", f"{marker_of(request)}-a")])

    planner = Agent(name=unique_name("planner"), model=scripted_llm.script(policy=plan_policy), tools=[survey])
    parent = Agent(name=unique_name("coder"), model=scripted_llm.script(["never asked"]), tools=[tools.lookup],
                   strategy="plan_execute", planner=planner, stateful=True)
    handle = agent_runtime.start(parent, "Please look up run-plan-5.")
    result = handle.wait(timeout=180)
    assert result.status is RunStatus.COMPLETED, result.error
    assert tools.keys == ["run-plan-5-a"] and calls.items == [("survey", "run-plan-5")]
    calls.assert_ran_in_tool_threads()
    assert json.loads(result.output) == {"key": "run-plan-5-a", "by": "here"}
    assert handle.run_id
    steps = [t for t in plan_sub_run_tasks(agent_runtime, handle.execution_id, parent.name)
             if t.get("taskDefName") == "lookup"]
    assert steps and {t.get("domain") for t in steps} == {handle.run_id}
    planner_runs = [t for t in agent_runtime._api.get_workflow(handle.execution_id, include_tasks=True)["tasks"]
                    if t.get("taskDefName") == planner.name and t.get("taskType") == "SUB_WORKFLOW"]
    [planner_run] = planner_runs
    survey_tasks = [t for t in agent_runtime._api.get_workflow(planner_run["subWorkflowId"], include_tasks=True)
                    ["tasks"] if t.get("taskDefName") == "survey"]
    assert survey_tasks and {t.get("domain") for t in survey_tasks} == {handle.run_id}
