"""A model call that cannot succeed is told from one that may (issue 34, point 1): the reasons are the
server's own words, recorded from a 3.32.3 server whose provider URL pointed at a closed loopback port
(no route), with no internet (an unknown host), and answering 401 (a refused key)."""

from __future__ import annotations

import pytest

from conductor_agents import ModelUnavailableError
from conductor_agents._liveness.model_calls import (
    classify_model_failure, model_failure_error, says_model_unavailable, unavailable_model_cancel_reason,
)
from conductor_agents.cli._progress import describe_event
from conductor_agents.events import ErrorEvent

REFUSED = ("Task execution failed: OpenAI Responses API call failed: Failed to connect to /127.0.0.1:45791 "
           "\u2014 caused by: Connection refused")
UNKNOWN_HOST = ("Task execution failed: Anthropic Messages API call failed: api.anthropic.com \u2014 caused by: "
                "api.anthropic.com")
REJECTED = ('Task execution failed: OpenAI Responses API call failed: Responses API failed with status 401: '
            '{"error": {"message": "Incorrect API key provided: sk-abc***xyz"}}')
NO_SUCH_MODEL = ('Task execution failed: OpenAI Responses API call failed: Responses API failed with status 404: '
                 '{"error": {"message": "The model gpt-9 does not exist", "code": "model_not_found"}}')


@pytest.mark.parametrize("reason, cause, detail", [
    (REFUSED, "no_route", "Failed to connect to /127.0.0.1:45791: Connection refused"),
    (UNKNOWN_HOST, "no_route", "unknown host api.anthropic.com"),
    (REJECTED, "rejected_key", "the provider answered HTTP 401"),
    (NO_SUCH_MODEL, "unknown_model", "the provider answered HTTP 404"),
])
def test_hopeless_model_calls_are_classified(reason: str, cause: str, detail: str) -> None:
    """No route and a refused key are the set-up's fault; the detail never carries the provider's body."""
    assert classify_model_failure(reason) == (cause, detail)


@pytest.mark.parametrize("reason", [
    "Task execution failed: OpenAI Responses API call failed: Responses API failed with status 429: slow down",
    "Task execution failed: OpenAI Responses API call failed: Responses API failed with status 503: upstream",
    "Task execution failed: OpenAI Responses API call failed: timeout \u2014 caused by: Read timed out",
    "Task execution failed: something else entirely", None, "",
])
def test_calls_that_may_pass_are_left_to_the_servers_retries(reason: object) -> None:
    assert classify_model_failure(reason) is None


def test_the_error_names_the_cause_and_the_fix_on_one_line() -> None:
    """The server's key variable for the provider, CONDUCTOR_AGENT_MODEL, the offline command; no key text."""
    err = model_failure_error("run-1", "openai/gpt-4o", *classify_model_failure(REJECTED))
    text = str(err)
    assert isinstance(err, ModelUnavailableError) and isinstance(err, ValueError)
    assert "\n" not in text and "sk-abc" not in text
    for part in ("openai/gpt-4o", "refused the server's key", "OPENAI_API_KEY", "CONDUCTOR_AGENT_MODEL",
                 "--scripted-model", "run-1 was cancelled"):
        assert part in text
    assert (err.variable, err.cause, err.execution_id) == ("OPENAI_API_KEY", "rejected_key", "run-1")


def test_a_model_the_provider_does_not_have_says_so() -> None:
    """HTTP 404: the model's name is wrong (or the key may not use it); choosing another model is the fix."""
    err = model_failure_error("run-1", "openai/gpt-9", *classify_model_failure(NO_SUCH_MODEL))
    text = str(err)
    assert "has no such model" in text and "CONDUCTOR_AGENT_MODEL" in text and "does not exist" not in text
    assert err.cause == "unknown_model"


def _run_error(message: str) -> ErrorEvent:
    return ErrorEvent(execution_id="run-1", id="run:TERMINATED", message=message, run_level=True)


@pytest.mark.parametrize("message", [REJECTED, unavailable_model_cancel_reason("the provider answered HTTP 401")])
def test_the_cli_prints_no_event_line_for_a_model_it_will_explain(message: str) -> None:
    """The run's "error" event is the failed call's reason or, once the SDK has cancelled the run, its cancel
    reason; either way the CLI's one error line (ModelUnavailableError) says it, so the progress prints nothing
    (CI, stop 33: the progress thread read the cancel's event before the CLI exited, two error lines)."""
    assert says_model_unavailable(message)
    assert describe_event(_run_error(message), [0]) == ([], None)


def test_other_errors_still_get_their_line() -> None:
    assert not says_model_unavailable("Task execution failed: something else entirely")
    lines, _ = describe_event(_run_error("the tool crashed"), [0])
    assert lines == ["error: the tool crashed"]


class _Api:
    """The one read FirstModelTurn makes: a run's tasks."""

    def __init__(self, tasks: list) -> None:
        self.tasks, self.reads = tasks, 0

    def get_workflow(self, execution_id: str, *, include_tasks: bool = False, timeout: object = None) -> dict:
        self.reads += 1
        return {"tasks": list(self.tasks)}


def _llm(status: str, reason: str = "") -> dict:
    return {"taskType": "LLM_CHAT_COMPLETE", "status": status, "reasonForIncompletion": reason,
            "inputData": {"llmProvider": "openai", "model": "gpt-4o"}}


def test_first_model_turn_reads_until_the_model_answered_then_never_again() -> None:
    from conductor_agents._liveness.model_calls import FirstModelTurn

    api = _Api([_llm("IN_PROGRESS")])
    watch = FirstModelTurn(api)
    assert watch.problem("run-1") is None and not watch.settled
    api.tasks = [_llm("FAILED", "Task execution failed: OpenAI Responses API call failed: Responses API failed "
                                "with status 503: busy"), _llm("COMPLETED")]
    assert watch.problem("run-1") is None and watch.settled  # a blip the retry got past
    assert watch.problem("run-1") is None and api.reads == 2


def test_a_hopeless_first_attempt_is_the_error_and_a_run_without_model_tasks_stops_costing_reads() -> None:
    from conductor_agents._liveness.model_calls import FirstModelTurn

    problem = FirstModelTurn(_Api([_llm("FAILED", REFUSED), _llm("SCHEDULED")])).problem("run-1")
    assert isinstance(problem, ModelUnavailableError) and problem.model == "openai/gpt-4o"
    quiet = _Api([{"taskType": "SUB_WORKFLOW", "status": "IN_PROGRESS"}])
    watch = FirstModelTurn(quiet, max_reads=3)
    for _ in range(5):
        assert watch.problem("run-1") is None
    assert quiet.reads == 3 and watch.settled


def test_an_ended_run_is_read_for_its_model_only_when_its_reason_says_so() -> None:
    """A run that FAILED after the server's retries (nobody waited at its first model call), or that the SDK
    cancelled for its model, is the same error (issue 41, point 5: a later wait() returned FAILED with the
    server's raw text); one read of its tasks, none for any other end; the error names the id the caller holds."""
    from conductor_agents._liveness.model_calls import ended_model_failure

    failed = _Api([_llm("FAILED", REFUSED)] * 4)
    err = ended_model_failure(failed, "run-2", f"Task failed: {REFUSED}", named="listener-1")
    assert isinstance(err, ModelUnavailableError) and (err.cause, err.execution_id) == ("no_route", "listener-1")
    assert str(err).endswith("run listener-1 failed") and failed.reads == 1
    cancelled = _Api([_llm("FAILED", REJECTED), _llm("CANCELED")])
    err = ended_model_failure(cancelled, "run-1", unavailable_model_cancel_reason("the provider answered HTTP 401"))
    assert err is not None and err.cause == "rejected_key" and str(err).endswith("run run-1 was cancelled")
    other = _Api([_llm("FAILED", REFUSED)])
    assert ended_model_failure(other, "run-1", "Task execution failed: the tool crashed") is None
    assert ended_model_failure(other, "run-1", None) is None and other.reads == 0
    answered_since = _Api([_llm("FAILED", REFUSED), _llm("COMPLETED")])
    assert ended_model_failure(answered_since, "run-1", REFUSED) is None


def test_an_ended_run_whose_tasks_cannot_be_read_is_left_as_it_ended() -> None:
    from conductor_agents import ServerUnavailableError
    from conductor_agents._liveness.model_calls import ended_model_failure

    class _Down(_Api):
        def get_workflow(self, execution_id: str, *, include_tasks: bool = False, timeout: object = None) -> dict:
            raise ServerUnavailableError("GET /workflow/run-1: cannot reach the server")

    assert ended_model_failure(_Down([]), "run-1", REFUSED) is None


def test_every_wait_that_reads_the_failure_raises_it(http) -> None:
    """wait() called after the run already FAILED for its model (and called again) raises
    ModelUnavailableError, not a FAILED result with the server's raw text."""
    import re

    from conductor_agents import AgentRuntime, AgentSettings
    from tests.unit.fakes import BASE_URL, status_body

    reason = f"Task 'chat' failed: {REFUSED}"
    http.add(http.GET, re.compile(BASE_URL + r"/agent/wf-1/status.*"),
             json=status_body("wf-1", "FAILED", reasonForIncompletion=reason))
    http.add(http.GET, re.compile(BASE_URL + r"/agent/executions/wf-1.*"), json={})
    http.add(http.GET, re.compile(BASE_URL + r"/workflow/wf-1.*"),
             json={"workflowId": "wf-1", "status": "FAILED", "reasonForIncompletion": reason, "input": {},
                   "variables": {}, "tasks": [_llm("FAILED", REFUSED)] * 4})
    with AgentRuntime(AgentSettings(server_url=BASE_URL)) as runtime:
        handle = runtime.attach("wf-1")
        for _ in range(2):
            with pytest.raises(ModelUnavailableError) as caught:
                handle.wait(timeout=5)
            assert caught.value.execution_id == "wf-1" and caught.value.model == "openai/gpt-4o"
            assert "Connection refused" in str(caught.value) and str(caught.value).endswith("run wf-1 failed")
