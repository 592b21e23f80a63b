"""Sub-agents, agent tools, server-side tools and guardrails: their values and the configs they send."""

from __future__ import annotations

import pytest

from conductor_agents import (
    Agent,
    ApiTool,
    AgentDefinitionError,
    AgentTypeError,
    Guardrail,
    GuardrailResult,
    Handoff,
    HandoffContext,
    HttpTool,
    HumanTool,
    InvalidAnswerError,
    PendingRequest,
    McpTool,
    Strategy,
    ToolDefinitionError,
    WaitForMessageTool,
    tool,
)
from conductor_agents.result import AgentResult, AgentStatus, RunStatus


@tool
def lookup(key: str) -> str:
    """Look a key up."""
    return key


@tool
def other_lookup(key: str) -> str:
    """Another tool."""
    return key


def specialist(**kwargs) -> Agent:
    return Agent(name="billing", model="openai/m", tools=[lookup], **kwargs)


class TestSubAgents:
    def test_strategy_config_and_tree_of_worker_tools(self):
        """agents/strategy reach agentConfig; the tree's worker tools are served with the parent's."""
        parent = Agent(name="desk", model="openai/m", agents=[specialist(), Agent(name="tech", model="openai/t")],
                       strategy="handoff", synthesize=False)
        config = parent.to_config()
        assert config["strategy"] == "handoff" and config["synthesize"] is False
        assert [a["name"] for a in config["agents"]] == ["billing", "tech"]
        assert [t.name for t in parent.worker_tools] == ["lookup"]
        assert parent.agent_names == ("billing", "tech")

    def test_default_strategy_is_handoff(self):
        """Sub-agents without a strategy are sent as the server's default, handoff."""
        parent = Agent(name="desk", model="openai/m", agents=[specialist()])
        assert parent.to_config()["strategy"] == "handoff"

    def test_a_stateful_sub_agent_makes_the_tree_stateful(self):
        """One stateful part pins the whole tree (the run gets a domain)."""
        assert Agent(name="desk", model="openai/m", agents=[specialist(stateful=True)]).is_stateful
        assert not Agent(name="desk", model="openai/m", agents=[specialist()]).is_stateful

    @pytest.mark.parametrize("kwargs, message", [
        (dict(strategy="handoff"), "strategy needs sub-agents"),
        (dict(agents=[specialist()], strategy="telepathy"), "strategy must be one of"),
        (dict(agents=[specialist()], router=Agent(name="r", model="openai/r")), "only used with strategy='router'"),
        (dict(agents=[specialist()], strategy="swarm", handoffs=[Handoff.on_text_mention("nobody", "x")]),
         "no agent is named 'nobody'"),
        (dict(agents=[specialist()], handoffs=[Handoff.on_text_mention("billing", "x")]), "only used with strategy='swarm'"),
        (dict(agents=[specialist(), specialist()]), "two entries named 'billing'"),
        (dict(agents=[Agent(name="desk", model="openai/m")]), "may not share its parent's name"),
        (dict(agents=[specialist()], strategy="round_robin", allowed_transitions={"billing": ["ghost"]}),
         "no agent is named 'ghost'"),
    ])
    def test_bad_teams_are_refused(self, kwargs, message):
        """Each inconsistent team raises an AgentDefinitionError naming the problem."""
        with pytest.raises(AgentDefinitionError, match=message):
            Agent(name="desk", model="openai/m", **kwargs)

    def test_agents_must_be_agents(self):
        """A non-Agent in agents is a type error."""
        with pytest.raises(AgentTypeError, match="holds Agent values"):
            Agent(name="desk", model="openai/m", agents=["billing"])

    def test_two_different_tools_of_one_name_in_a_tree_are_refused(self):
        """The server routes by name: two different 'lookup' tools in one tree cannot both be served."""
        def clash_lookup(key: str) -> str:
            return key

        clash = tool(name="lookup")(clash_lookup)
        with pytest.raises(AgentDefinitionError, match="two different tools are named 'lookup'"):
            Agent(name="desk", model="openai/m", tools=[clash], agents=[specialist()])

    def test_swarm_handoffs_and_transitions(self):
        """Handoff rules and allowed transitions use the server's field names."""
        parent = Agent(name="desk", model="openai/m", agents=[specialist()], strategy=Strategy.SWARM,
                       handoffs=[Handoff.on_tool_result("billing", "lookup", "due"),
                                 Handoff.on_text_mention("desk", "back")],
                       allowed_transitions={"billing": ["desk"]})
        config = parent.to_config()
        assert config["handoffs"] == [
            {"type": "on_tool_result", "target": "billing", "toolName": "lookup", "resultContains": "due"},
            {"type": "on_text_mention", "target": "desk", "text": "back"},
        ]
        assert config["allowedTransitions"] == {"billing": ["desk"]}


class TestConditionHandoff:
    def tech(self) -> Agent:
        return Agent(name="tech", model="openai/t")

    def test_config_names_a_worker_per_condition(self):
        """An on_condition rule sends the worker task the SDK serves, named after the swarm and the rule's index."""
        parent = Agent(name="desk", model="openai/m", agents=[specialist(), self.tech()], strategy="swarm",
                       handoffs=[Handoff.on_text_mention("billing", "bill"),
                                 Handoff.on_condition("tech", lambda ctx: "error" in ctx.result)])
        config = parent.to_config()
        assert config["handoffs"][1] == {"type": "on_condition", "target": "tech", "taskName": "desk_handoff_1"}
        assert "desk_handoff_1" in [t.name for t in parent.worker_tools]

    def test_the_worker_answers_in_the_servers_shape(self):
        """The worker gets the server's inputs as a HandoffContext and answers {"handoff": bool}."""
        seen = []

        def condition(ctx: HandoffContext) -> bool:
            seen.append(ctx)
            return "error" in ctx.result

        parent = Agent(name="desk", model="openai/m", agents=[specialist(), self.tech()], strategy="swarm",
                       handoffs=[Handoff.on_condition("tech", condition)])
        [worker] = [t for t in parent.worker_tools if t.name == "desk_handoff_0"]
        inputs = {"result": "an error here", "conversation": "so far", "context": {"k": 1}, "active_agent": "1",
                  "tool_results": [{"name": "lookup", "output": "x"}]}
        assert worker.invoke(inputs) == {"handoff": True}
        assert seen == [HandoffContext(agent="billing", result="an error here", conversation="so far",
                                       tool_results=({"name": "lookup", "output": "x"},), state={"k": 1})]
        assert worker.invoke({**inputs, "active_agent": "0", "result": "fine"}) == {"handoff": False}
        assert seen[-1].agent == "desk"
        # the target itself answering never hands the conversation to itself (that would loop)
        assert worker.invoke({**inputs, "active_agent": "2"}) == {"handoff": False}
        assert len(seen) == 2
        assert worker.invoke({"result": None, "active_agent": None, "tool_results": None, "context": None}) == \
            {"handoff": False}
        assert seen[-1] == HandoffContext(agent="desk", result="", conversation="")

    def test_bad_conditions(self):
        """A condition must be callable; its target must be an agent of the swarm; only a swarm has handoffs."""
        with pytest.raises(AgentTypeError, match="needs a callable"):
            Handoff.on_condition("tech", "soon")
        with pytest.raises(AgentDefinitionError, match="no agent is named 'ghost'"):
            Agent(name="desk", model="openai/m", agents=[specialist()], strategy="swarm",
                  handoffs=[Handoff.on_condition("ghost", lambda ctx: True)])
        with pytest.raises(AgentDefinitionError, match="only used with strategy='swarm'"):
            Agent(name="desk", model="openai/m", agents=[specialist()], strategy="handoff",
                  handoffs=[Handoff.on_condition("billing", lambda ctx: True)])
        with pytest.raises(AgentDefinitionError, match="needs condition"):
            Handoff("on_condition", "tech")

    def test_a_long_swarm_name_gets_a_short_stable_task_name(self):
        """Task names have at most 64 characters."""
        name = "s" * 100
        build = lambda: Agent(name=name, model="openai/m", agents=[specialist()], strategy="swarm",  # noqa: E731
                              handoffs=[Handoff.on_condition("billing", lambda ctx: True)])
        task = build().to_config()["handoffs"][0]["taskName"]
        assert len(task) == 64 and task.endswith("_handoff_0") and task == build().to_config()["handoffs"][0]["taskName"]

    def test_a_stateful_swarm_serves_its_conditions(self):
        """The condition is one of the tree's worker tools, so a stateful swarm serves it on the run's domain."""
        parent = Agent(name="desk", model="openai/m", agents=[specialist()], strategy="swarm", stateful=True,
                       handoffs=[Handoff.on_condition("billing", lambda ctx: True)])
        assert parent.is_stateful and {"lookup", "desk_handoff_0"} <= {t.name for t in parent.worker_tools}


class TestFunctionRouter:
    def team(self, router, **kwargs) -> Agent:
        return Agent(name="desk", model="openai/m", agents=[specialist(), Agent(name="tech", model="openai/t")],
                     strategy="router", router=router, **kwargs)

    def test_config_is_a_worker_ref(self):
        """A callable router is sent as the server's WorkerRef and served as a worker task."""
        parent = self.team(lambda conversation: "billing")
        assert parent.to_config()["router"] == {"taskName": "desk_route"}
        assert "desk_route" in [t.name for t in parent.worker_tools]

    def test_the_worker_returns_the_name_or_done(self):
        """The worker passes the conversation and answers {"result": name}; DONE/None end the loop."""
        seen = []
        answers = iter(["tech", None, "done", specialist()])

        def route(conversation: str):
            seen.append(conversation)
            return next(answers)

        [worker] = [t for t in self.team(route).worker_tools if t.name == "desk_route"]
        assert worker.invoke({"prompt": "p", "conversation": "hello"}) == {"result": "tech"}
        assert worker.invoke({"conversation": "x"}) == {"result": "DONE"}
        assert worker.invoke({"conversation": "x"}) == {"result": "DONE"}
        assert worker.invoke({"prompt": "only prompt"}) == {"result": "billing"}
        assert seen == ["hello", "x", "x", "only prompt"]

    def test_an_unknown_name_fails_the_task_with_the_names(self):
        """A name that is no sub-agent's is an error (the server would silently end the loop)."""
        [worker] = [t for t in self.team(lambda c: "ghost").worker_tools if t.name == "desk_route"]
        with pytest.raises(ValueError, match=r"returned 'ghost'.*\['billing', 'tech'\]"):
            worker.invoke({"conversation": "x"})
        [worker] = [t for t in self.team(lambda c: 3).worker_tools if t.name == "desk_route"]
        with pytest.raises(ValueError, match="returned 3"):
            worker.invoke({"conversation": "x"})

    def test_bad_routers(self):
        """A router must be an Agent or a callable, and only strategy='router' uses one."""
        with pytest.raises(AgentTypeError, match="Agent, a callable or None"):
            self.team("billing")
        with pytest.raises(AgentDefinitionError, match="only used with strategy='router'"):
            Agent(name="desk", model="openai/m", agents=[specialist()], strategy="handoff", router=lambda c: "billing")

    def test_a_stateful_team_serves_its_router(self):
        """The router worker is one of the tree's worker tools, so a stateful team serves it on the run's domain."""
        parent = self.team(lambda c: "billing", stateful=True)
        assert parent.is_stateful and {"lookup", "desk_route"} <= {t.name for t in parent.worker_tools}
        assert not self.team(lambda c: "billing").is_stateful


class TestAgentTool:
    def test_as_tool_carries_the_sub_agent_and_its_workers(self):
        """as_tool(): an agent_tool with the sub-agent's config and its worker names; the parent serves them."""
        at = specialist().as_tool(name="ask_billing", description="Ask billing.")
        assert at.tool_type == "agent_tool" and at.func is None
        assert at.config["agentConfig"]["name"] == "billing"
        assert at.config["workerNames"] == ["lookup"]
        assert at.input_schema["required"] == ["request"]
        parent = Agent(name="desk", model="openai/m", tools=[at, other_lookup])
        assert [t.name for t in parent.worker_tools] == ["other_lookup", "lookup"]
        assert "agentConfig" not in repr(at)

    def test_defaults_come_from_the_agent(self):
        """Name and description default to the agent's."""
        at = Agent(name="helper", model="openai/m", description="Helps.").as_tool()
        assert (at.name, at.description) == ("helper", "Helps.")
        assert "workerNames" not in at.config


class TestHttpTool:
    def test_config_uses_the_servers_names(self):
        """url, method, headers (placeholders kept), pathTemplate, queryParams, accept, contentType."""
        t = HttpTool.create(name="price", url="http://127.0.0.1:9/api", method="post",
                            headers={"Authorization": "Bearer ${PRICE_TOKEN}", "X-Team": "a"},
                            path_template="/items/{sku}", query_params=["currency"],
                            input_schema={"type": "object", "properties": {"sku": {"type": "string"}}})
        assert t.tool_type == "http"
        assert t.config == {"url": "http://127.0.0.1:9/api", "method": "POST", "accept": "application/json",
                            "contentType": "application/json",
                            "headers": {"Authorization": "Bearer ${PRICE_TOKEN}", "X-Team": "a"},
                            "pathTemplate": "/items/{sku}", "queryParams": ["currency"]}
        assert t.to_config()["toolType"] == "http"

    def test_a_literal_credential_is_refused_without_echoing_it(self):
        """A credential header must be a ${NAME} placeholder; the error never shows the value."""
        with pytest.raises(ToolDefinitionError) as info:
            HttpTool.create(name="price", url="https://x.example/", headers={"X-Api-Key": "sk-live-123456"})
        assert "X-Api-Key" in str(info.value) and "sk-live-123456" not in str(info.value)

    def test_repr_never_shows_headers(self):
        """A ToolDef's repr leaves its config (and so its headers) out."""
        t = HttpTool.create(name="price", url="https://x.example/", headers={"X-Note": "plain-but-private"})
        assert "plain-but-private" not in repr(t)

    @pytest.mark.parametrize("kwargs, message", [
        (dict(url="ftp://x"), "http:// or https:// URL"),
        (dict(url="https://user:pw@x.example/"), "must not carry credentials"),
        (dict(url="https://x.example/", method="BREW"), "method must be one of"),
        (dict(url="https://x.example/", headers={"Authorization": "Bearer ${not a name}"}), "names no secret"),
        (dict(url="https://x.example/", path_template="items"), "path_template"),
    ])
    def test_bad_values(self, kwargs, message):
        with pytest.raises(ToolDefinitionError, match=message):
            HttpTool.create(name="t", **kwargs)


class TestMcpTool:
    def test_config(self):
        """server_url, headers and max_tools, as the server reads them."""
        t = McpTool.create(server_url="http://127.0.0.1:9/mcp", name="calc",
                           headers={"Authorization": "Bearer ${MCP_TOKEN}"}, max_tools=5)
        assert t.tool_type == "mcp"
        assert t.config == {"server_url": "http://127.0.0.1:9/mcp", "headers": {"Authorization": "Bearer ${MCP_TOKEN}"},
                            "max_tools": 5}

    def test_bad_max_tools(self):
        with pytest.raises(ToolDefinitionError, match="max_tools"):
            McpTool.create(server_url="http://127.0.0.1:9/mcp", max_tools=0)


class TestApiTool:
    def test_config(self):
        """The spec's url, headers and max_tools, as the server reads them."""
        t = ApiTool.create(spec_url="http://127.0.0.1:9/openapi.json", name="shop",
                           headers={"X-Api-Key": "${SHOP_KEY}"}, max_tools=3)
        assert t.tool_type == "api"
        assert t.config == {"url": "http://127.0.0.1:9/openapi.json", "headers": {"X-Api-Key": "${SHOP_KEY}"},
                            "max_tools": 3}


class TestGuardrails:
    def test_regex_config(self):
        """A regex guardrail is the server's GuardrailConfig."""
        g = Guardrail.regex("no_keys", [r"sk-\w+"], message="No keys.", max_retries=2)
        assert g.to_config() == {"name": "no_keys", "guardrailType": "regex", "position": "output",
                                 "onFail": "retry", "maxRetries": 2, "patterns": [r"sk-\w+"], "mode": "block",
                                 "message": "No keys."}
        assert g.worker is None

    def test_function_guardrail_is_a_worker_with_the_servers_verdict_shape(self):
        """A pass carries no on_fail (the server would count it as a failure); a failure carries it."""
        g = Guardrail.function(lambda text: GuardrailResult("bad" not in text, "Be nice.", "nice"), name="nice",
                               on_fail="fix")
        assert g.to_config()["taskName"] == "nice"
        worker = g.worker
        assert worker is not None and worker.name == "nice" and worker == g.worker
        assert worker.invoke({"content": "good", "iteration": 1}) == {"passed": True}
        assert worker.invoke({"content": "bad", "iteration": 1}) == {
            "passed": False, "message": "Be nice.", "on_fail": "fix", "fixed_output": "nice"}
        assert worker.invoke({"content": None}) == {"passed": True}
        agent = Agent(name="a", model="openai/m", guardrails=[g])
        assert [t.name for t in agent.worker_tools] == ["nice"]
        assert agent.to_config()["guardrails"][0]["guardrailType"] == "custom"

    def test_a_bool_verdict(self):
        g = Guardrail.function(lambda text: len(text) < 5, name="short")
        assert g.worker.invoke({"content": "too long"})["on_fail"] == "retry"

    @pytest.mark.parametrize("build, message", [
        (lambda: Guardrail.regex("g", []), "at least one pattern"),
        (lambda: Guardrail.regex("g", ["("]), "not a regular expression"),
        (lambda: Guardrail.regex("g", ["x"], on_fail="fix"), "needs a function guardrail"),
        (lambda: Guardrail.regex("g", ["x"], on_fail="shrug"), "on_fail must be one of"),
        (lambda: Guardrail.regex("bad name", ["x"]), "name must be"),
        (lambda: Guardrail.llm("g", model="openai/m", policy=""), "needs a model"),
        (lambda: Guardrail.regex("g", ["x"], max_retries=0), "max_retries"),
    ])
    def test_bad_guardrails(self, build, message):
        with pytest.raises((AgentDefinitionError, AgentTypeError), match=message):
            build()


class TestResult:
    def test_agents_run_and_agent_tool_calls_come_from_the_tasks(self):
        """Sub-agent SUB_WORKFLOW tasks give agents_run; an agent tool's SUB_WORKFLOW is a tool call."""
        tasks = [
            {"taskType": "SUB_WORKFLOW", "taskDefName": "desk_router", "status": "COMPLETED"},
            {"taskType": "SUB_WORKFLOW", "taskDefName": "billing", "status": "COMPLETED", "referenceTaskName": "h0"},
            {"taskType": "SUB_WORKFLOW", "taskDefName": "tech", "status": "FAILED"},
            {"taskType": "SUB_WORKFLOW", "taskDefName": "helper", "status": "COMPLETED", "referenceTaskName": "call_1",
             "inputData": {"workflowInput": {"_agent_tool_name": "ask", "prompt": "hi", "__today__": "x",
                                             "session_id": ""}},
             "outputData": {"result": "hello"}},
        ]
        status = AgentStatus(execution_id="e", status=RunStatus.COMPLETED, output={"result": "ok"})
        result = AgentResult.from_server(status, {}, tasks, agent_names=("billing", "tech"))
        assert result.agents_run == ("billing",) and result.answered_by == "billing"
        [call] = result.tool_calls
        assert (call.name, call.arguments, call.output) == ("ask", {"prompt": "hi"}, {"result": "hello"})
        assert AgentResult.from_server(status, {}, tasks).answered_by is None


class TestStopWhen:
    def test_config_and_worker(self):
        """stop_when becomes stopWhen's worker task; its output is should_continue, the rule negated."""
        agent = Agent(name="walker", model="openai/m", tools=[lookup], stop_when=lambda text, turn: turn >= 2)
        assert agent.to_config()["stopWhen"] == {"taskName": "walker_stop_when"}
        [worker] = [t for t in agent.worker_tools if t.name == "walker_stop_when"]
        assert worker.invoke({"result": None, "iteration": 1}) == {"should_continue": True}
        assert worker.invoke({"result": "x", "iteration": 2}) == {"should_continue": False}

    def test_a_long_agent_name_gets_a_short_stable_task_name(self):
        """Task names have at most 64 characters: a long agent name is cut and hashed, the same each time."""
        name = "a" * 100
        first = Agent(name=name, model="openai/m", tools=[lookup], stop_when=lambda t, n: True).to_config()["stopWhen"]["taskName"]
        assert len(first) <= 64 and first.endswith("_stop_when")
        assert first == Agent(name=name, model="openai/m", tools=[lookup], stop_when=lambda t, n: True).to_config()["stopWhen"]["taskName"]

    def test_must_be_callable(self):
        with pytest.raises(AgentTypeError, match="stop_when must be a callable"):
            Agent(name="walker", model="openai/m", stop_when="soon")


class TestTermination:
    def test_conditions_and_config(self):
        """Conditions use the server's TerminationConfig names; | and & join them."""
        from conductor_agents import Termination

        either = Termination.text_mention("done", case_sensitive=False) | Termination.max_messages(3)
        assert either.to_config() == {"type": "or", "conditions": [
            {"type": "text_mention", "text": "done", "caseSensitive": False},
            {"type": "max_message", "maxMessages": 3}]}
        assert either.reached("All DONE", 1) and either.reached("", 3) and not either.reached("go on", 2)
        both = Termination.stop_message("STOP") & Termination.max_messages(2)
        assert both.reached(" STOP ", 2) and not both.reached("STOP", 1)

    def test_token_usage_uses_the_servers_names_and_counts(self):
        """token_usage: the server's TerminationConfig fields; ends once a count exceeds its limit."""
        from conductor_agents import Termination

        limit = Termination.token_usage(max_total_tokens=100, max_completion_tokens=20)
        assert limit.to_config() == {"type": "token_usage", "maxTotalTokens": 100, "maxCompletionTokens": 20}
        assert limit.needs_token_usage and (limit | Termination.max_messages(3)).needs_token_usage
        assert not Termination.max_messages(3).needs_token_usage
        assert not limit.reached("", 1, {"totalTokens": 100, "completionTokens": 20})
        assert limit.reached("", 1, {"totalTokens": 101}) and limit.reached("", 1, {"completionTokens": "21"})
        assert not limit.reached("", 1, None) and not limit.reached("", 1, {"totalTokens": True})
        prompt = Termination.token_usage(max_prompt_tokens=5)
        assert prompt.to_config() == {"type": "token_usage", "maxPromptTokens": 5}
        assert (prompt & Termination.text_mention("x")).reached("x", 1, {"promptTokens": 6})

    @pytest.mark.parametrize("kwargs", [{}, {"max_total_tokens": 0}, {"max_prompt_tokens": -3},
                                        {"max_completion_tokens": 2.5}, {"max_total_tokens": True},
                                        {"max_total_tokens": "100"}])
    def test_bad_token_limits_are_refused(self, kwargs):
        from conductor_agents import Termination

        with pytest.raises(AgentDefinitionError, match="Termination.token_usage"):
            Termination.token_usage(**kwargs)

    def test_worker_is_named_as_the_server_names_its_task(self):
        """The task is the agent's name, non-word characters as '_', plus '_termination'."""
        from conductor_agents import Termination

        agent = Agent(name="my-team", model="openai/m", tools=[lookup], termination=Termination.max_messages(2))
        [worker] = [t for t in agent.worker_tools if t.name.endswith("_termination")]
        assert worker.name == "my_team_termination"
        assert worker.invoke({"result": "x", "iteration": 2}) == {"should_continue": False}
        assert agent.to_config()["termination"] == {"type": "max_message", "maxMessages": 2}
        with pytest.raises(AgentDefinitionError, match="at most 52 characters"):
            Agent(name="a" * 60, model="openai/m", tools=[lookup], termination=Termination.max_messages(2))
        with pytest.raises(AgentDefinitionError, match="termination needs tools or sub-agents"):
            Agent(name="alone", model="openai/m", termination=Termination.max_messages(2))
        with pytest.raises(AgentDefinitionError, match="stop_when needs tools or sub-agents"):
            Agent(name="alone", model="openai/m", stop_when=lambda text, turn: True)


class TestTree:
    def test_root_finder_follows_parents_and_caches(self):
        """RootFinder climbs parentWorkflowId to the top-level run, one read per run, cached."""
        from conductor_agents._liveness.tree import RootFinder
        from conductor_agents.errors import ServerError

        reads: list = []
        parents = {"c2": "c1", "c1": "root", "root": None}

        class Api:
            def get_workflow(self, workflow_id):
                reads.append(workflow_id)
                if workflow_id == "gone":
                    raise ServerError("no")
                return {"parentWorkflowId": parents[workflow_id]}

        finder = RootFinder(Api())
        assert finder.root_of("c2") == "root"
        assert finder.root_of("c2") == "root" and reads == ["c2", "c1", "root"]
        assert finder.root_of("gone") is None

    def test_running_sub_runs_descends(self):
        """running_sub_runs yields the IN_PROGRESS SUB_WORKFLOW tasks' sub-runs, depth first."""
        from conductor_agents._wire.api import TaskPage
        from conductor_agents._liveness.tree import running_sub_runs

        tasks = {"p": [{"taskType": "SUB_WORKFLOW", "subWorkflowId": "a"}, {"taskType": "lookup"}],
                 "a": [{"taskType": "SUB_WORKFLOW", "subWorkflowId": "b"}], "b": []}

        class Api:
            def workflow_tasks(self, execution_id, **kwargs):
                assert kwargs["statuses"] == ("IN_PROGRESS",)
                return TaskPage(total=len(tasks[execution_id]), tasks=tasks[execution_id], date=None)

        assert list(running_sub_runs(Api(), "p")) == ["a", "b"]


class TestManual:
    PICK = {
        "taskId": "h7", "taskType": "HUMAN", "status": "IN_PROGRESS", "seq": 4, "startTime": 1796167516000,
        "referenceTaskName": "my_desk_pick_agent__1", "taskDefName": "my_desk_pick_agent",
        "inputData": {"__humanTaskDefinition": {"displayName": "my-desk: Select next agent"},
                      "response_schema": {"type": "object"}, "agent_options": {"tech": "1", "billing": "0"},
                      "conversation": "Help me."},
    }

    def team(self, **kwargs) -> Agent:
        return Agent(name="my-desk", model="openai/m", agents=[specialist(), Agent(name="tech", model="openai/t")],
                     strategy="manual", **kwargs)

    def test_config_and_the_selection_worker(self):
        """strategy='manual' is sent as is; the server's selection task is served, named as the server names it."""
        team = self.team()
        assert team.to_config()["strategy"] == "manual"
        assert Strategy.parse("MANUAL") is Strategy.MANUAL
        [worker] = [t for t in team.worker_tools if t.name == "my_desk_process_selection"]
        assert worker.invoke({"human_output": {"answer": "tech", "answer_id": "a"}}) == {"selected": "1"}
        assert worker.invoke({"human_output": {"selected": "billing"}}) == {"selected": "0"}  # the server's form
        assert worker.invoke({"human_output": {"answer": {"selected": " tech "}}}) == {"selected": "1"}
        with pytest.raises(ValueError, match=r"picked 'ghost'.*\['billing', 'tech'\]"):
            worker.invoke({"human_output": {"answer": "ghost"}})
        assert team.waits_for_people and self.team(stateful=True).is_stateful

    def test_a_name_too_long_for_the_servers_task_is_refused(self):
        with pytest.raises(AgentDefinitionError, match="at most 46 characters"):
            Agent(name="m" * 50, model="openai/m", agents=[specialist()], strategy="manual")

    def test_the_pick_is_a_question_with_options(self):
        """The pick shows as a question whose options are the sub-agents in the server's order."""
        from conductor_agents._people.pending import pending_in

        [pick] = pending_in({"workflowId": "wf", "status": "RUNNING", "tasks": [self.PICK]}, "wf")
        assert (pick.kind, pick.options, pick.task_id) == (PendingRequest.QUESTION, ("billing", "tech"), "h7")
        assert pick.question == "Which agent should answer next: billing, tech?"
        assert pick.arguments["conversation"] == "Help me."
        assert pick.to_dict()["options"] == ["billing", "tech"]

    def test_the_answer_the_run_took_is_what_the_selection_task_was_given(self):
        from conductor_agents._people.pending import consumed_answer

        human = {**self.PICK, "status": "COMPLETED", "outputData": {"answer": "tech", "answer_id": "late"}}
        selection = {"taskType": "SIMPLE", "status": "SCHEDULED", "seq": 5,
                     "referenceTaskName": "my_desk_process_selection__1",
                     "inputData": {"human_output": {"answer": "billing", "answer_id": "first"}}}
        workflow = {"workflowId": "wf", "status": "RUNNING", "tasks": [human, selection]}
        assert consumed_answer(workflow, human).answer_id == "first"
        assert consumed_answer({**workflow, "tasks": [human]}, human) is None

    def test_respond_takes_only_an_option(self):
        """An answer that names no sub-agent is refused before anything is sent; a good one goes as answer
        and selected."""
        from conductor_agents._people import approvals as _approvals

        sent = []

        class Api:
            def get_workflow(self, execution_id, include_tasks=True):
                tasks = [dict(self_pick)]
                if sent:
                    tasks = [{**self_pick, "status": "COMPLETED", "outputData": sent[0]["outputData"]},
                             {"taskType": "SIMPLE", "status": "SCHEDULED", "seq": 5,
                              "referenceTaskName": "my_desk_process_selection__1",
                              "inputData": {"human_output": sent[0]["outputData"]}}]
                return {"workflowId": "wf", "status": "RUNNING", "tasks": tasks}

            def update_task(self, body):
                sent.append(body)

        self_pick = self.PICK
        with pytest.raises(InvalidAnswerError, match=r"one of \['billing', 'tech'\], got 'ghost'") as info:
            _approvals.respond(Api(), "wf", "ghost")  # type: ignore[arg-type]
        assert (info.value.options, info.value.answer, info.value.execution_id) == (("billing", "tech"), "ghost", "wf")
        assert sent == []
        answer = _approvals.respond(Api(), "wf", Agent(name="tech", model="openai/t"),  # type: ignore[arg-type]
                                    pause=lambda s: None)
        assert answer.answer == "tech"
        assert sent[0]["outputData"]["selected"] == "tech" and sent[0]["taskId"] == "h7"


@tool
def optional_arg(key: str, limit: "int | None" = None) -> str:
    """A tool with an optional argument."""
    return key


def shell(cmd: str) -> str:
    """Run a command."""
    return cmd


class TestPlanExecute:
    PLANNER = Agent(name="planner", model="openai/p", instructions="Plan.")

    def team(self, **kwargs) -> Agent:
        kwargs.setdefault("tools", [lookup])
        kwargs.setdefault("planner", self.PLANNER)
        return Agent(name="coder", model="openai/m", strategy="plan_execute", **kwargs)

    def test_config_uses_the_servers_named_slots(self):
        """strategy='plan_execute' sends planner, fallback and fallbackMaxTurns."""
        fallback = Agent(name="fixer", model="openai/f", tools=[other_lookup])
        team = self.team(fallback=fallback, fallback_max_turns=3)
        assert team.strategy is Strategy.PLAN_EXECUTE
        config = team.to_config()
        assert config["strategy"] == "plan_execute"
        assert config["planner"] == self.PLANNER.to_config() and config["fallback"] == fallback.to_config()
        # also as agents: the server routes a stateful run's worker tools of its agents only to the run's domain
        assert config["agents"] == [self.PLANNER.to_config(), fallback.to_config()]
        assert config["fallbackMaxTurns"] == 3
        assert [t["name"] for t in config["tools"]] == ["lookup"]
        assert "fallback" not in self.team().to_config() and "fallbackMaxTurns" not in self.team().to_config()

    def test_the_tree_of_worker_tools_and_the_agents_that_answer(self):
        """The parent's tools (the plan's steps), the planner's and the fallback's are served here; a stateful
        planner or fallback pins the tree; planner and fallback are what agents_run is made of."""
        planner = Agent(name="planner", model="openai/p", tools=[other_lookup])
        team = self.team(planner=planner, fallback=Agent(name="fixer", model="openai/f", stateful=True))
        assert sorted(t.name for t in team.worker_tools) == ["lookup", "other_lookup"]
        assert team.is_stateful and team.has_sub_runs
        assert team.team_names == ("planner", "fixer") and team.agent_names == ()
        assert not self.team().is_stateful
        tasks = [
            {"taskType": "SUB_WORKFLOW", "taskDefName": "planner", "status": "COMPLETED"},
            {"taskType": "SUB_WORKFLOW", "taskDefName": "pe_coder_plan", "status": "FAILED"},
            {"taskType": "SUB_WORKFLOW", "taskDefName": "fixer", "status": "COMPLETED"},
        ]
        status = AgentStatus(execution_id="e", status=RunStatus.COMPLETED, output={"result": "ok"})
        result = AgentResult.from_server(status, {}, tasks, agent_names=team.team_names)
        assert result.agents_run == ("planner", "fixer") and result.answered_by == "fixer"

    @pytest.mark.parametrize("kwargs, message", [
        (dict(planner=None), r"needs planner=<Agent>"),
        (dict(tools=[]), "needs tools"),
        (dict(agents=[specialist()]), r"never runs agents=\[...\]"),
        (dict(fallback_max_turns=2), "fallback_max_turns needs a fallback"),
        (dict(fallback_max_turns=0, fallback=Agent(name="f", model="openai/f")), r"Agent\.fallback_max_turns must be an int >= 1 or None, got 0"),
        (dict(stop_when=lambda text, turn: True), "never evaluates stop_when"),
        (dict(planner=Agent(name="coder", model="openai/p")), "may not share their parent's name"),
        (dict(fallback=Agent(name="planner", model="openai/x")), "two different agents are named 'planner'"),
        (dict(tools=[optional_arg]), r"'optional_arg''s input schema uses 'anyOf' at /properties/limit.*"
                                     r"Optional\[...\] or Union hint"),
        (dict(tools=[HttpTool.create(name="get", url="http://h", input_schema={"type": "object", "properties": {
            "when": {"type": "string", "format": "date"}}})]), r"'get''s input schema uses 'format' at /properties/when"),
        (dict(tools=[tool(approval_required=True)(shell)]), "the tool 'shell' needs approval"),
        (dict(tools=[HumanTool.create()]), "asks a person"),
        (dict(tools=[WaitForMessageTool.create()]), "waits for messages"),
        (dict(tools=[tool(guardrails=[Guardrail.regex("no_rm", ["rm"], on_fail="retry")])(shell)]),
         "on_fail='retry'; in a plan the server can only stop the plan"),
    ])
    def test_bad_plan_teams_are_refused(self, kwargs, message):
        """Each config the server (3.32.3) would refuse or silently never run raises an AgentDefinitionError."""
        with pytest.raises(AgentDefinitionError, match=message):
            self.team(**kwargs)

    def test_a_retrying_tool_guardrail_is_fine_with_a_fallback(self):
        """With a fallback the server accepts any on_fail of a tool guardrail (a failed plan goes to the fallback)."""
        guarded = tool(name="guarded", guardrails=[Guardrail.regex("no_rm", ["rm"], on_fail="retry")])(shell)
        assert self.team(tools=[guarded], fallback=Agent(name="f", model="openai/f")).to_config()["fallback"]

    @pytest.mark.parametrize("field, value", [("planner", Agent(name="p", model="openai/p")),
                                              ("fallback", Agent(name="f", model="openai/f")),
                                              ("fallback_max_turns", 2)])
    def test_the_slots_need_plan_execute(self, field, value):
        """planner, fallback and fallback_max_turns mean nothing to another strategy (the server refuses them)."""
        with pytest.raises(AgentDefinitionError, match=f"Agent.{field} is only used with strategy='plan_execute'"):
            Agent(name="desk", model="openai/m", agents=[specialist()], strategy="sequential", **{field: value})

    def test_slots_must_be_agents(self):
        with pytest.raises(AgentTypeError, match="Agent.planner must be an Agent or None"):
            self.team(planner="planner")

    def test_a_plan_steps_ambient_inputs_do_not_reach_the_tool(self):
        """A plan's step adds session_id, cwd and media to every tool call; a tool that does not declare them
        never sees them, one that declares them does."""
        assert lookup.parse_arguments({"key": "k", "session_id": "", "cwd": None, "media": None}) == {"key": "k"}

        @tool
        def where(cwd: str) -> str:
            """Where am I."""
            return cwd

        assert where.parse_arguments({"cwd": "/tmp", "session_id": ""}) == {"cwd": "/tmp"}
