"""ScriptedLLM: the fake OpenAI Responses API, driven over loopback HTTP as the Conductor server would."""

from __future__ import annotations

import json
import threading
import time
import uuid
from typing import Any, Callable, Dict, List, Optional

import pytest
import requests

import conductor_agents.testing as testing
from conductor_agents.testing import _policies
from conductor_agents.errors import ConductorAgentsError
from conductor_agents.testing import (
    Failure,
    LLMRequest,
    Reply,
    ScriptedLLM,
    ScriptedLLMStateError,
    ScriptedLLMTimeoutError,
    ScriptError,
    ToolCall,
    ToolOutput,
    Usage,
    listener_policy,
)

THREAD_PREFIX = "conductor-agents-scripted-llm"
HTTP_TIMEOUT = 5.0

# --- real request bodies, as Conductor 3.32.3 sent them ---------------------------------

PROBE_TOOLS = [
    {
        "type": "function",
        "name": "probe_tool",
        "description": "d",
        "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}},
    }
]

FIRST_TURN_BODY = {
    "model": "gpt-4o",
    "instructions": "hi",
    "input": [{"type": "message", "role": "user", "content": "go"}],
    "tools": PROBE_TOOLS,
    "max_output_tokens": 16384,
}

SECOND_TURN_BODY = {
    "model": "gpt-4o",
    "instructions": "hi",
    "input": [
        {
            "type": "message",
            "role": "user",
            "content": '[TOOL RESULTS]\n[{"output":{"answer":42},"name":"probe_tool"}]\n[/TOOL RESULTS]\n\ngo',
        },
        {"type": "function_call", "call_id": "c0_0", "name": "probe_tool", "arguments": '{"method":"probe_tool","x":1}'},
        {"type": "function_call_output", "call_id": "c0_0", "output": '{"answer":42}'},
        {"type": "message", "role": "user", "content": "Please continue where you left off."},
    ],
    "tools": PROBE_TOOLS,
    "max_output_tokens": 16384,
}

WAIT_OUTPUT = json.dumps(
    {
        "messages": [
            {
                "id": "4f06f799-c5a0-4c0f-895d-e753707eb69d",
                "workflowId": "a6748fc8-5ead-4ae4-888d-f50e6848ac65",
                "payload": {"action": "generate-report"},
                "receivedAt": "2026-11-29T09:45:33.012233351Z",
            }
        ],
        "count": 1,
    }
)

WAIT_TURN_BODY = {
    "model": "gpt-4o",
    "instructions": "hi",
    "input": [
        {"type": "message", "role": "user", "content": "[TOOL RESULTS]\n[...]\n[/TOOL RESULTS]\n\ngo"},
        {"type": "function_call", "call_id": "c2_0", "name": "wait_for_message", "arguments": '{"method":"wait_for_message"}'},
        {"type": "function_call_output", "call_id": "c2_0", "output": WAIT_OUTPUT},
        {"type": "message", "role": "user", "content": "Please continue where you left off."},
    ],
    "tools": [{"type": "function", "name": "wait_for_message", "description": "wait", "parameters": {"type": "object"}}],
    "max_output_tokens": 16384,
}

# The third turn of a run whose model first made two parallel calls, then one.
THIRD_TURN_BODY = {
    "model": "gpt-4o",
    "input": [
        {"type": "message", "role": "user", "content": "[TOOL RESULTS]\n[]\n[/TOOL RESULTS]\n\ngo"},
        {"type": "function_call", "call_id": "callA_0", "name": "probe_tool", "arguments": '{"method":"probe_tool","x":1}'},
        {"type": "function_call", "call_id": "callB_1", "name": "probe_tool", "arguments": '{"method":"probe_tool","x":2}'},
        {"type": "function_call_output", "call_id": "callA_0", "output": '{"got":1}'},
        {"type": "function_call_output", "call_id": "callB_1", "output": '{"got":2}'},
        {"type": "function_call", "call_id": "callC2_0", "name": "probe_tool", "arguments": '{"method":"probe_tool","x":12}'},
        {"type": "function_call_output", "call_id": "callC2_0", "output": "not json"},
        {"type": "message", "role": "user", "content": "Please continue where you left off."},
    ],
    "tools": PROBE_TOOLS,
}


# --- helpers ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llm():
    """One ScriptedLLM shared by the module, as a session fixture would share it."""
    with ScriptedLLM() as fake:
        yield fake


def bare(model: str) -> str:
    return model.split("/", 1)[1]


def post(llm: ScriptedLLM, body: Dict[str, Any]) -> requests.Response:
    return requests.post(llm.base_url + "/responses", json=body, timeout=HTTP_TIMEOUT)


def ask(llm: ScriptedLLM, model: str, body: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """POST a request for ``model`` (first-turn shape unless ``body`` is given); return the JSON reply."""
    payload = dict(body or FIRST_TURN_BODY)
    payload["model"] = bare(model)
    response = post(llm, payload)
    assert response.status_code == 200, response.text
    return response.json()


def text_of(reply: Dict[str, Any]) -> Optional[str]:
    items = [i for i in reply["output"] if i["type"] == "message"]
    return items[0]["content"][0]["text"] if items else None


def calls_of(reply: Dict[str, Any]) -> List[Dict[str, Any]]:
    return [i for i in reply["output"] if i["type"] == "function_call"]


def parsed(body: Dict[str, Any]) -> LLMRequest:
    return LLMRequest.from_body(body, received_at=0.0)


class Conversation:
    """Plays the Conductor server's side of one run: keeps the history and runs the tools."""

    def __init__(self, llm: ScriptedLLM, model: str, tools: Dict[str, Callable[[dict], Any]], prompt: str = "go"):
        self.llm, self.model, self.tools, self.prompt = llm, model, tools, prompt
        self.history: List[Dict[str, Any]] = []
        self.calls: List[tuple] = []

    def body(self) -> Dict[str, Any]:
        items: List[Dict[str, Any]] = [{"type": "message", "role": "user", "content": self.prompt}]
        if self.history:
            items[0]["content"] = "[TOOL RESULTS]\n[]\n[/TOOL RESULTS]\n\n" + self.prompt
            items += self.history + [{"type": "message", "role": "user", "content": "Please continue where you left off."}]
        tools = [{"type": "function", "name": name, "description": "", "parameters": {}} for name in self.tools]
        return {"model": bare(self.model), "instructions": "", "input": items, "tools": tools}

    def step(self) -> Optional[str]:
        """One LLM turn; runs the tools it asks for; returns the final text, if it gave one."""
        reply = ask(self.llm, self.model, self.body())
        if text_of(reply) is not None:
            return text_of(reply)
        calls = calls_of(reply)
        outputs = []
        for index, call in enumerate(calls):
            call_id = f"{call['call_id']}_{index}"
            arguments = json.loads(call["arguments"])
            self.calls.append((call["name"], arguments))
            self.history.append(
                {"type": "function_call", "call_id": call_id, "name": call["name"],
                 "arguments": json.dumps({"method": call["name"], **arguments})}
            )
            outputs.append({"type": "function_call_output", "call_id": call_id,
                            "output": json.dumps(self.tools[call["name"]](arguments))})
        self.history += outputs
        return None

    def run(self, max_turns: int = 20) -> str:
        for _ in range(max_turns):
            text = self.step()
            if text is not None:
                return text
        raise AssertionError(f"no final text within {max_turns} turns; calls: {self.calls}")


def message_queue(*batches: List[Any]) -> Callable[[dict], Any]:
    """A wait_for_message tool that delivers the given batches of payloads, one batch per call."""
    pending = list(batches)

    def wait(_arguments: dict) -> Any:
        payloads = pending.pop(0)
        envelopes = [{"id": str(uuid.uuid4()), "workflowId": "wf", "payload": p, "receivedAt": "now"} for p in payloads]
        return {"messages": envelopes, "count": len(envelopes)}

    return wait


def scripted_threads() -> List[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(THREAD_PREFIX) and t.is_alive()]


# --- the public surface ----------------------------------------------------------------


def test_exports_are_pinned():
    """The testing namespace exports exactly the documented names."""
    assert sorted(testing.__all__) == sorted([
        "Anomaly", "Failure", "LLMRequest", "LocalCluster", "LocalStack", "Policy", "Reply", "ScriptError", "ScriptedLLM",
        "ScriptedLLMStateError", "ScriptedLLMTimeoutError", "ToolCall", "ToolOutput", "Turn",
        "Usage", "is_stop_signal", "listener_policy",
    ])
    for name in testing.__all__:
        assert hasattr(testing, name)


def test_errors_subclass_the_package_base_and_builtins():
    """Each error is a ConductorAgentsError and the builtin a test would catch."""
    assert issubclass(ScriptError, ConductorAgentsError) and issubclass(ScriptError, ValueError)
    assert issubclass(ScriptedLLMTimeoutError, TimeoutError)
    assert issubclass(ScriptedLLMStateError, RuntimeError)


def test_base_url_and_server_env(llm):
    """base_url is loopback /v1 and server_env is ready to hand to a server process."""
    assert llm.base_url == f"http://127.0.0.1:{llm.port}/v1"
    assert llm.server_env() == {"OPENAI_BASE_URL": llm.base_url, "OPENAI_API_KEY": "scripted-llm",
                                "ANTHROPIC_BASE_URL": f"http://127.0.0.1:{llm.port}",
                                "ANTHROPIC_API_KEY": "scripted-llm"}


def _messages(llm: ScriptedLLM, body: Dict[str, Any]) -> requests.Response:
    return requests.post(f"http://127.0.0.1:{llm.port}/v1/messages", json=body, timeout=HTTP_TIMEOUT)


def test_an_anthropic_model_gets_the_script_of_its_name_as_a_messages_answer(llm):
    """``anthropic/<name>`` (the server's POST /v1/messages) is answered by the script of ``<name>``: a
    tool_use block, then text; a tool_result block is the request's tool output (issue 41, point 5)."""
    model = llm.script([ToolCall("lookup", {"q": "x"}, call_id="toolu_1"), "the answer"])
    name = model.split("/", 1)[1]
    tools = [{"name": "lookup", "description": "Look up.", "input_schema": {"type": "object"}}]
    first = _messages(llm, {"model": name, "system": "Be brief.", "max_tokens": 100, "tools": tools,
                            "messages": [{"role": "user", "content": "go"}]})
    assert first.status_code == 200
    assert first.json()["content"] == [{"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"q": "x"}}]
    assert first.json()["stop_reason"] == "tool_use" and first.json()["usage"] == {"input_tokens": 10,
                                                                                    "output_tokens": 5}
    second = _messages(llm, {"model": name, "tools": tools, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "go"}]},
        {"role": "assistant",
         "content": [{"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"q": "x"}}]},
        {"role": "user",
         "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": '{"hit": 1}'}]}]})
    assert second.json()["content"] == [{"type": "text", "text": "the answer"}]
    assert second.json()["stop_reason"] == "end_turn"
    request = llm.requests_for(model)[1]
    assert (request.path, request.prompt, request.tools) == ("/v1/messages", "go", ("lookup",))
    assert [(out.name, out.arguments, out.output) for out in request.tool_outputs] == [
        ("lookup", {"q": "x"}, {"hit": 1})]
    assert llm.requests_for(model)[0].instructions == "Be brief."


def test_an_anthropic_request_with_only_the_servers_digest_reads_each_entry_as_a_turn(llm):
    """The server (3.32.3) sends an Anthropic model no tool blocks, only its digest of the tool results: each
    entry is one turn's output, so a listener's policy sees the messages its wait tool returned last."""
    model = llm.script(["ok"])
    digest = ('[TOOL RESULTS]\n[{"output":{"noted":"hi"},"name":"note"},'
              '{"output":{"messages":[{"id":"m1","payload":{"a":1}}]},"name":"wait_for_message"}]'
              '\n[/TOOL RESULTS]\n\ngo')
    _messages(llm, {"model": model.split("/", 1)[1], "messages": [{"role": "user", "content": digest}]})
    request = llm.requests_for(model)[0]
    assert [[out.name for out in turn] for turn in request.tool_output_turns] == [["note"], ["wait_for_message"]]
    assert request.tool_outputs[0].output == {"messages": [{"id": "m1", "payload": {"a": 1}}]}
    assert request.prompt == "go"


def test_an_anthropic_failure_is_an_anthropic_error_object(llm):
    model = llm.script(["unused"])
    llm.fail_next(model, status=401, body={"error": {"message": "bad key", "type": "authentication_error"}})
    response = _messages(llm, {"model": model.split("/", 1)[1], "messages": [{"role": "user", "content": "go"}]})
    assert response.status_code == 401
    assert response.json() == {"type": "error", "error": {"type": "authentication_error", "message": "bad key"}}


# --- value types -----------------------------------------------------------------------


def test_value_types_validate_at_construction():
    """Malformed turns fail in the test's thread with ScriptError."""
    with pytest.raises(ScriptError):
        Reply(text="x", tool_calls=[ToolCall("t")])
    with pytest.raises(ScriptError):
        Reply()
    with pytest.raises(ScriptError):
        ToolCall("t", {"when": object()})
    with pytest.raises(ScriptError):
        ToolCall("")
    with pytest.raises(ScriptError):
        Failure(status=200)
    assert Usage(input_tokens=3, output_tokens=4).to_dict() == {"input_tokens": 3, "output_tokens": 4, "total_tokens": 7}


def test_tool_call_copies_its_arguments():
    """Changing the caller's dict afterwards does not change the script."""
    arguments = {"x": 1}
    call = ToolCall("t", arguments)
    arguments["x"] = 2
    assert call.arguments == {"x": 1}
    assert hash(call) == hash(ToolCall("t", {"x": 5}))


def test_script_rejects_bad_scripts(llm):
    """Bad turns name their position; duplicate models need replace=True."""
    with pytest.raises(ScriptError, match="turn 1"):
        llm.script(["ok", {"not": "a turn"}])
    with pytest.raises(ScriptError):
        llm.script([[]])
    with pytest.raises(ScriptError):
        llm.script()
    with pytest.raises(ScriptError):
        llm.script("a bare string")
    model = llm.script(["one"], model="fixed-name-test")
    assert model == "openai/fixed-name-test"
    with pytest.raises(ScriptError, match="already has a script"):
        llm.script(["two"], model="openai/fixed-name-test")
    llm.script(["two"], model="openai/fixed-name-test", replace=True)
    assert text_of(ask(llm, model)) == "two"


# --- answering -------------------------------------------------------------------------


def test_turns_are_answered_in_order(llm):
    """str → final text, ToolCall → one call, list → parallel calls, Reply → full control."""
    model = llm.script([
        ToolCall("probe_tool", {"x": 1}),
        [ToolCall("probe_tool", {"x": 2}), ToolCall("other", call_id="mine")],
        Reply(text="custom", usage={"input_tokens": 100, "output_tokens": 7}),
        "all done",
    ])
    assert model.startswith("openai/scripted-") and len(bare(model)) == len("scripted-") + 8

    first = ask(llm, model)
    assert first["object"] == "response" and first["status"] == "completed" and first["model"] == bare(model)
    [call] = calls_of(first)
    assert (call["name"], json.loads(call["arguments"]), call["status"]) == ("probe_tool", {"x": 1}, "completed")
    assert first["usage"] == {"input_tokens": 10, "output_tokens": 5, "total_tokens": 15}

    second = calls_of(ask(llm, model))
    assert [c["name"] for c in second] == ["probe_tool", "other"]
    assert second[1]["call_id"] == "mine"
    assert second[0]["call_id"] != call["call_id"]

    third = ask(llm, model)
    assert text_of(third) == "custom"
    assert third["usage"] == {"input_tokens": 100, "output_tokens": 7, "total_tokens": 107}
    assert third["output"][0]["role"] == "assistant"
    assert text_of(ask(llm, model)) == "all done"
    assert llm.remaining_turns(model) == 0
    assert llm.anomalies_for(model) == ()


def test_generated_call_ids_are_unique(llm):
    """Generated call ids look like call_<n> and never repeat, within or across replies."""
    model = llm.script([[ToolCall("a"), ToolCall("b"), ToolCall("c")]] * 3)
    ids = [c["call_id"] for _ in range(3) for c in calls_of(ask(llm, model))]
    assert len(set(ids)) == 9
    assert all(i.startswith("call_") for i in ids)


def test_policy_answers_every_request(llm):
    """A policy sees the parsed request and may answer with any turn form."""
    seen: List[LLMRequest] = []

    def policy(request: LLMRequest):
        seen.append(request)
        if request.is_first_turn:
            return ToolCall("probe_tool", {"x": 1})
        return f"got {request.tool_outputs[0].output['answer']}"

    model = llm.script(policy=policy)
    assert calls_of(ask(llm, model))[0]["name"] == "probe_tool"
    assert text_of(ask(llm, model, SECOND_TURN_BODY)) == "got 42"
    assert [r.model for r in seen] == [bare(model)] * 2
    assert seen[0].tools == ("probe_tool",) and seen[0].instructions == "hi"


def test_turns_first_then_policy(llm):
    """With both, the turns are used first and the policy answers after them."""
    model = llm.script(["scripted"], policy=lambda request: "from policy")
    assert [text_of(ask(llm, model)) for _ in range(3)] == ["scripted", "from policy", "from policy"]
    assert not llm.exhausted(model)


def test_routing_by_model_under_concurrency(llm):
    """Two scripts served at once from many threads never mix their turns."""
    turns = 40
    model_a = llm.script([f"a{i}" for i in range(turns)])
    model_b = llm.script([f"b{i}" for i in range(turns)])
    got: Dict[str, List[str]] = {model_a: [], model_b: []}
    lock = threading.Lock()

    def client(model: str) -> None:
        for _ in range(turns // 4):
            text = text_of(ask(llm, model))
            with lock:
                got[model].append(text)

    threads = [threading.Thread(target=client, args=(m,)) for m in (model_a, model_b) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(got[model_a], key=lambda s: int(s[1:])) == [f"a{i}" for i in range(turns)]
    assert sorted(got[model_b], key=lambda s: int(s[1:])) == [f"b{i}" for i in range(turns)]
    assert len(llm.requests_for(model_a)) == turns and len(llm.requests_for(bare(model_b))) == turns


def test_slow_policy_does_not_block_other_models(llm):
    """A policy runs under no global lock: another model is answered while it blocks."""
    release = threading.Event()
    slow = llm.script(policy=lambda request: "slow" if release.wait(10) else "timed out")
    fast = llm.script(["fast"])
    answer: Dict[str, str] = {}
    thread = threading.Thread(target=lambda: answer.setdefault("slow", text_of(ask(llm, slow))))
    thread.start()
    try:
        llm.wait_for_requests(slow, 1, timeout=5)
        started = time.monotonic()
        assert text_of(ask(llm, fast)) == "fast"
        assert time.monotonic() - started < 2
    finally:
        release.set()
        thread.join(10)
    assert answer == {"slow": "slow"}


def test_fail_next_then_recovers(llm):
    """fail_next answers `count` requests with the status, then the script resumes."""
    model = llm.script(["recovered"])
    llm.fail_next(model, status=503, count=2)
    assert llm.remaining_turns(model) == 3
    statuses = [post(llm, {**FIRST_TURN_BODY, "model": bare(model)}) for _ in range(2)]
    assert [r.status_code for r in statuses] == [503, 503]
    assert statuses[0].json()["error"]["type"] == "server_error"
    assert text_of(ask(llm, model)) == "recovered"
    assert len(llm.requests_for(model)) == 3
    with pytest.raises(ScriptError):
        llm.fail_next("openai/never-scripted")
    with pytest.raises(ScriptError):
        llm.fail_next(model, count=0)


def test_failure_turn_with_custom_body(llm):
    """A Failure turn sends its status and body in place of a reply."""
    model = llm.script([Failure(status=429, body={"error": {"message": "slow down"}}), "ok"])
    response = post(llm, {**FIRST_TURN_BODY, "model": bare(model)})
    assert (response.status_code, response.json()) == (429, {"error": {"message": "slow down"}})
    assert text_of(ask(llm, model)) == "ok"


# --- anomalies -------------------------------------------------------------------------


def test_unknown_model_is_refused_as_a_provider_refuses_it_naming_the_scripted_models(llm):
    """An unscripted model is answered HTTP 404 ``model_not_found`` (what a provider answers for a model it does
    not have), naming the models scripted here, and recorded as an anomaly."""
    llm.script(["hi"], model="the-one-scripted")
    response = post(llm, {**FIRST_TURN_BODY, "model": "nobody-scripted-me"})
    assert response.status_code == 404, response.text
    body = response.json()
    assert body["error"]["code"] == "model_not_found"
    message = body["error"]["message"]
    assert "no script for model 'nobody-scripted-me'" in message
    assert "the models scripted here are openai/" in message  # this module's llm scripts many: the first 10
    [anomaly] = llm.anomalies_for("nobody-scripted-me")
    assert anomaly.kind == "unknown_model" and anomaly.request.model == "nobody-scripted-me"


def test_exhausted_script_answers_200_and_records(llm):
    """Past its last turn a script says it is exhausted, and the test can tell."""
    model = llm.script(["only"])
    assert not llm.exhausted(model)
    assert text_of(ask(llm, model)) == "only"
    assert "exhausted" in text_of(ask(llm, model))
    assert llm.exhausted(model)
    assert [a.kind for a in llm.anomalies_for(model)] == ["exhausted"]
    with pytest.raises(AssertionError, match="exhausted"):
        llm.assert_no_anomalies(model)


def test_policy_exception_answers_200_and_records(llm):
    """A policy that raises ends the run with a text naming the error, and records it."""
    def broken(request):
        raise KeyError("payload")

    model = llm.script(policy=broken)
    text = text_of(ask(llm, model))
    assert "raised KeyError" in text and "payload" in text
    [anomaly] = llm.anomalies_for(model)
    assert anomaly.kind == "policy_error" and anomaly.message == text


def test_policy_bad_return_is_recorded(llm):
    """A policy returning something that is not a turn is an anomaly too."""
    model = llm.script(policy=lambda request: None)
    assert "bad turn" in text_of(ask(llm, model))
    assert [a.kind for a in llm.anomalies_for(model)] == ["policy_error"]


def test_unknown_path_and_bad_body(llm):
    """Other paths get a JSON 404; a body that is not JSON gets a 400 and an anomaly."""
    response = requests.post(llm.base_url + "/chat/completions", json={}, timeout=HTTP_TIMEOUT)
    assert response.status_code == 404 and "error" in response.json()
    assert requests.get(llm.base_url + "/models", timeout=HTTP_TIMEOUT).status_code == 404
    before = len(llm.anomalies)
    response = requests.post(llm.base_url + "/responses", data=b"{not json", timeout=HTTP_TIMEOUT)
    assert response.status_code == 400
    assert [a.kind for a in llm.anomalies[before:]] == ["bad_request"]


# --- recorded requests -----------------------------------------------------------------


def test_requests_are_recorded(llm):
    """requests and requests_for are snapshots, in arrival order, with the raw body."""
    model = llm.script(["a", "b"])
    ask(llm, model)
    ask(llm, model, SECOND_TURN_BODY)
    recorded = llm.requests_for(model)
    assert [r.is_first_turn for r in recorded] == [True, False]
    assert recorded[1].body["max_output_tokens"] == 16384
    assert recorded[0].received_at <= recorded[1].received_at
    assert set(recorded) <= set(llm.requests)
    assert recorded == llm.requests_for(bare(model))


def test_wait_for_requests_returns_when_enough_arrive(llm):
    """wait_for_requests wakes as soon as the n-th request arrives."""
    model = llm.script(["a", "b"])
    timer = threading.Timer(0.2, lambda: [ask(llm, model) for _ in range(2)])
    timer.start()
    try:
        assert len(llm.wait_for_requests(model, 2, timeout=10)) == 2
    finally:
        timer.join(10)


def test_wait_for_requests_is_bounded(llm):
    """Too few requests → ScriptedLLMTimeoutError after about the timeout, with typed fields."""
    model = llm.script(["a"])
    ask(llm, model)
    started = time.monotonic()
    with pytest.raises(ScriptedLLMTimeoutError) as caught:
        llm.wait_for_requests(model, 3, timeout=0.3)
    assert 0.25 <= time.monotonic() - started < 3
    assert (caught.value.model, caught.value.expected, caught.value.received) == (bare(model), 3, 1)


# --- request parsing -------------------------------------------------------------------


def test_parse_first_turn():
    """The first turn has no tool outputs and the plain prompt."""
    request = parsed(FIRST_TURN_BODY)
    assert request.is_first_turn and request.turn_index == 0
    assert request.tool_outputs == () and request.messages == []
    assert (request.model, request.instructions, request.tools) == ("gpt-4o", "hi", ("probe_tool",))
    assert request.user_text == "go" and request.prompt == "go"


def test_parse_pairs_outputs_with_their_calls():
    """Outputs are paired by call id; the server's `method` is dropped; JSON output is parsed."""
    request = parsed(SECOND_TURN_BODY)
    assert not request.is_first_turn and request.turn_index == 1
    assert request.tool_outputs == (ToolOutput(name="probe_tool", call_id="c0_0", arguments={"x": 1}, output={"answer": 42}),)
    assert request.prompt == "go"
    assert request.user_text.endswith("Please continue where you left off.")


def test_parse_messages_from_wait_output():
    """The payloads of a wait-for-message output are the turn's messages."""
    request = parsed(WAIT_TURN_BODY)
    assert request.messages == [{"action": "generate-report"}]
    [output] = request.tool_outputs
    assert output.name == "wait_for_message" and output.arguments == {}
    assert output.output["count"] == 1


def test_parse_groups_history_by_turn():
    """Only the latest turn's outputs are `tool_outputs`; history keeps every turn."""
    request = parsed(THIRD_TURN_BODY)
    assert request.turn_index == 2
    assert [len(turn) for turn in request.tool_output_turns] == [2, 1]
    [latest] = request.tool_outputs
    assert (latest.call_id, latest.arguments, latest.output) == ("callC2_0", {"x": 12}, "not json")
    assert [o.output for o in request.all_tool_outputs] == [{"got": 1}, {"got": 2}, "not json"]
    assert request.messages == []


def test_parse_tolerates_odd_bodies():
    """A string input, missing fields and content parts do not break parsing."""
    request = parsed({"model": "m", "input": "hello"})
    assert request.user_text == "hello" and request.tools == () and request.instructions is None
    parts = parsed({"input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}]})
    assert parts.prompt == "hi" and parts.model == ""


# --- listener_policy -------------------------------------------------------------------


def act(arguments: dict) -> dict:
    return {"done": arguments["action"]}


def test_listener_policy_loops_until_stop(llm):
    """wait → act on the message → wait → stop signal → stop text."""
    model = llm.script(policy=listener_policy(lambda p: ToolCall("act", {"action": p["action"]})))
    run = Conversation(llm, model, {
        "wait_for_message": message_queue([{"action": "generate-report"}], [{"action": "again"}], [{"_signal": "stop"}]),
        "act": act,
    })
    assert run.run() == "stopped"
    assert run.calls == [
        ("wait_for_message", {}), ("act", {"action": "generate-report"}),
        ("wait_for_message", {}), ("act", {"action": "again"}),
        ("wait_for_message", {}),
    ]
    llm.assert_no_anomalies(model)


def test_listener_policy_handles_batches(llm):
    """Several messages in one batch → parallel actions; [action, stop] → act, then stop."""
    policy = listener_policy(lambda p: ToolCall("act", {"action": p["action"]}), stop_text="bye")
    model = llm.script(policy=policy)
    run = Conversation(llm, model, {
        "wait_for_message": message_queue([{"action": "a1"}, {"action": "a2"}], [{"action": "a3"}, {"_signal": "stop"}, {"action": "late"}]),
        "act": act,
    })
    assert run.run() == "bye"
    assert run.calls == [
        ("wait_for_message", {}), ("act", {"action": "a1"}), ("act", {"action": "a2"}),
        ("wait_for_message", {}), ("act", {"action": "a3"}),
    ]
    assert policy._endings == {}  # nothing left behind


def test_listener_policy_ignores_none_and_ends_on_text(llm):
    """on_message None → wait again; a str → the run's final text."""
    def on_message(payload):
        if payload.get("kind") == "noise":
            return None
        if payload.get("kind") == "finish":
            return "finished by message"
        return ToolCall("act", {"action": payload["kind"]})

    model = llm.script(policy=listener_policy(on_message, wait_tool="inbox"))
    run = Conversation(llm, model, {
        "inbox": message_queue([{"kind": "noise"}], [{"kind": "work"}], [{"kind": "finish"}]),
        "act": act,
    })
    assert run.run() == "finished by message"
    assert [c[0] for c in run.calls] == ["inbox", "inbox", "act", "inbox"]


def test_listener_policy_without_memory_recomputes(llm):
    """A fresh policy object mid-run (no memory of the batch) still ends after the actions."""
    on_message = lambda p: ToolCall("act", {"action": p["action"]})  # noqa: E731
    model = llm.script(policy=listener_policy(on_message))
    run = Conversation(llm, model, {"wait_for_message": message_queue([{"action": "a"}, {"_signal": "stop"}]), "act": act})
    assert run.step() is None and run.step() is None  # waited, then acted
    llm.script(policy=listener_policy(on_message), model=model, replace=True)
    assert run.step() == "stopped"


def test_listener_policy_error_in_on_message_is_an_anomaly(llm):
    """on_message raising surfaces as a policy_error anomaly, and the run ends."""
    model = llm.script(policy=listener_policy(lambda p: p["missing"]))
    run = Conversation(llm, model, {"wait_for_message": message_queue([{"action": "x"}]), "act": act})
    assert "KeyError" in run.run()
    assert [a.kind for a in llm.anomalies_for(model)] == ["policy_error"]


# --- lifecycle -------------------------------------------------------------------------


def test_lifecycle_stop_is_idempotent_and_leaves_no_thread():
    """start once; stop twice; no conductor-agents-scripted-llm thread survives."""
    before = scripted_threads()
    fake = ScriptedLLM()
    fake.stop()  # safe before start
    fake = ScriptedLLM()
    with pytest.raises(ScriptedLLMStateError):
        fake.base_url
    fake.start()
    assert fake.is_running and "running" in repr(fake)
    with pytest.raises(ScriptedLLMStateError):
        fake.start()
    model = fake.script(["x"])
    assert text_of(ask(fake, model)) == "x"
    fake.stop()
    fake.stop()
    assert not fake.is_running
    assert [t for t in scripted_threads() if t not in before] == []
    with pytest.raises(requests.ConnectionError):
        post(fake, FIRST_TURN_BODY)


def test_context_manager_stops_even_on_error():
    """Leaving the with-block by an exception still stops and joins."""
    before = scripted_threads()
    with pytest.raises(RuntimeError):
        with ScriptedLLM() as fake:
            assert [t.name for t in scripted_threads() if t not in before] == [THREAD_PREFIX]
            raise RuntimeError("boom")
    assert not fake.is_running
    assert [t for t in scripted_threads() if t not in before] == []


def _wait_turn_body(*waits: "tuple[str, str]", acted_on_last: bool = False) -> Dict[str, Any]:
    """A request whose history is the given (call id, message id) waits, each acted on before the
    last one, with the last wait's output the latest turn. The prompt's digest of the run's tool
    results lists each wait and action; with ``acted_on_last`` also an action after the last wait
    (the server's variables are a turn ahead of the history it sent)."""
    digest: List[Dict[str, Any]] = []
    for index, (_call_id, message_id) in enumerate(waits):
        digest.append({"output": {"messages": [{"id": message_id}], "count": 1}, "name": "wait_for_message"})
        if index < len(waits) - 1 or acted_on_last:
            digest.append({"output": {}, "name": "act"})
    content = f"[TOOL RESULTS]\n{json.dumps(digest)}\n[/TOOL RESULTS]\n\ngo"
    items: List[Dict[str, Any]] = [{"type": "message", "role": "user", "content": content}]
    for index, (call_id, message_id) in enumerate(waits):
        output = {"messages": [{"id": message_id, "workflowId": "wf", "payload": {"action": message_id}}], "count": 1}
        items += [{"type": "function_call", "call_id": call_id, "name": "wait_for_message",
                   "arguments": '{"method":"wait_for_message"}'},
                  {"type": "function_call_output", "call_id": call_id, "output": json.dumps(output)}]
        if index < len(waits) - 1:
            items += [{"type": "function_call", "call_id": f"act_{call_id}", "name": "act",
                       "arguments": json.dumps({"method": "act", "action": message_id})},
                      {"type": "function_call_output", "call_id": f"act_{call_id}", "output": "{}"}]
    return {"model": "m", "input": items}


def test_listener_policy_does_not_act_twice_on_a_history_one_turn_behind():
    """Seen on a two-node cluster: the turn after an action was built from the history before it,
    so the last output was again the wait just acted on. Acting again would run the tool twice."""
    policy = listener_policy(lambda p: ToolCall("act", {"action": p["action"]}))
    first = policy(parsed(_wait_turn_body(("w1", "m1"))))
    assert [call.name for call in first] == ["act"]
    lagging = policy(parsed(_wait_turn_body(("w1", "m1"), acted_on_last=True)))
    assert lagging.name == "wait_for_message"
    # The same message delivered again by a new wait call is acted on again: a duplicate
    # delivery by the server stays visible to the test that sent it.
    again = policy(parsed(_wait_turn_body(("w1", "m1"), ("w2", "m1"))))
    assert [(call.name, call.arguments) for call in again] == [("act", {"action": "m1"})]


def test_listener_policy_ends_on_the_lagging_turn_when_the_batch_said_stop():
    """[action, stop]: the actions run, and a lagging turn ends the run as the turn after would."""
    policy = listener_policy(lambda p: ToolCall("act", {"action": p["action"]}), stop_text="bye",
                             is_stop=lambda p: p.get("action") == "stop-me")
    def body(acted: bool) -> Dict[str, Any]:
        made = _wait_turn_body(("w1", "m1"), acted_on_last=acted)
        output = json.loads(made["input"][2]["output"])
        output["messages"].append({"id": "m2", "workflowId": "wf", "payload": {"action": "stop-me"}})
        made["input"][2]["output"] = json.dumps(output)
        return made

    assert [call.name for call in policy(parsed(body(False)))] == ["act"]
    assert policy(parsed(body(True))) == "bye"


def test_listener_policy_answers_a_turn_asked_again_the_same_way():
    """The server may ask the same turn twice (a retried model task: the first answer's actions never
    ran, and the digest has no result after the wait): the actions are asked for again. Seen in the
    crash/resume test when a first version of the lag rule lost a message's action."""
    policy = listener_policy(lambda p: ToolCall("act", {"action": p["action"]}))
    body = _wait_turn_body(("w1", "m1"))
    assert [call.name for call in policy(parsed(body))] == ["act"]
    assert [(call.name, call.arguments) for call in policy(parsed(body))] == [("act", {"action": "m1"})]
    no_digest = _wait_turn_body(("w1", "m1"), acted_on_last=True)
    no_digest["input"][0]["content"] = "go"
    assert [call.name for call in policy(parsed(no_digest))] == ["act"]  # no proof the actions ran


def test_listener_policy_remembers_a_bounded_number_of_answered_waits():
    policy = listener_policy(lambda p: ToolCall("act", {"action": p["action"]}))
    for index in range(_policies._ANSWERED_LIMIT + 10):
        policy(parsed(_wait_turn_body((f"w{index}", f"m{index}"))))
    assert len(policy._answered) == _policies._ANSWERED_LIMIT


def test_parse_tool_results_digest():
    """The digest at the head of the first user message, parsed; None when absent or cut short."""
    assert parsed(WAIT_TURN_BODY).tool_results_digest is None  # "[...]" is not JSON
    assert parsed(FIRST_TURN_BODY).tool_results_digest is None
    body = _wait_turn_body(("w1", "m1"), acted_on_last=True)
    assert [e["name"] for e in parsed(body).tool_results_digest] == ["wait_for_message", "act"]
    assert parsed(body).prompt == "go"
