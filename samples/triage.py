"""A triage listener that hands each message to one of two specialist sub-agents.

- ``orders`` answers order questions with an HTTP tool the *server* calls (no worker, no code here):
  ``GET <order service>/orders/{order_id}``, its token a ``${ORDER_API_TOKEN}`` placeholder the
  server fills in from its secrets.
- ``support`` answers account questions with a Python tool that runs in this process (the listener
  is stateful, so its sub-agents' tools are pinned here too), and a guardrail that blocks an API key
  leaking into its answer: the model is told to revise, and does.

Run it offline (a real Conductor server on this machine, a scripted model, a local order service):

    python samples/triage.py

Or against your own server (holding the secret ORDER_API_TOKEN) and a real model:

    CONDUCTOR_SERVER_URL=http://localhost:8080/api ORDER_SERVICE_URL=https://orders.example.com \\
    CONDUCTOR_AGENT_MODEL=anthropic/claude-sonnet-4-6 python samples/triage.py --remote
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import re
import threading
import urllib.parse
from typing import Any, Dict, Iterator, Optional

from conductor_agents import (
    Agent,
    AgentRuntime,
    AgentSettings,
    Guardrail,
    HttpTool,
    ToolRegistry,
    WaitForMessageTool,
    tool,
)

KEY_PATTERN = r"sk-[A-Za-z0-9]{8,}"


class Accounts:
    """The support specialist's tool. State lives on the instance, in this process."""

    def __init__(self) -> None:
        self.looked_up: "list[str]" = []

    @tool
    def lookup_account(self, user: str) -> dict:
        """Look up a customer's account: plan, status and API key."""
        self.looked_up.append(user)
        print(f"  [tool in this process] lookup_account(user={user!r})")
        return {"user": user, "plan": "pro", "status": "active", "api_key": "sk-" + "a1b2c3d4e5f6"}


def build_agent(models: Dict[str, str], accounts: Accounts, order_service_url: str,
                token_secret: str = "ORDER_API_TOKEN") -> Agent:
    """The triage listener and its two specialists (``models`` maps role -> 'provider/model';
    ``token_secret`` names the server's secret that holds the order service's token)."""
    get_order = HttpTool.create(
        name="get_order", url=order_service_url, path_template="/orders/{order_id}",
        description="Fetch an order's status by its id.",
        headers={"Authorization": f"Bearer ${{{token_secret}}}"},
        input_schema={"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]},
    )
    orders = Agent(name="triage_orders", model=models["orders"], tools=[get_order],
                   instructions="Answer questions about orders. Look the order up first.",
                   description="Order status questions.")
    support = Agent(name="triage_support", model=models["support"], tools=ToolRegistry.from_instance(accounts),
                    instructions="Answer account questions. Never reveal API keys.",
                    description="Account questions.",
                    guardrails=[Guardrail.regex("no_api_keys", [KEY_PATTERN], message="Never reveal API keys")])
    receive = WaitForMessageTool.create(name="wait_for_message")
    return Agent(
        name="triage",
        model=models["triage"],
        stateful=True,
        max_turns=1_000,
        tools=[receive, orders.as_tool(name="ask_orders"), support.as_tool(name="ask_support")],
        instructions="Loop: wait_for_message, hand it to ask_orders or ask_support, repeat until told to stop.",
    )


def run_scenario(settings: AgentSettings, models: Dict[str, str], order_service_url: str,
                 token_secret: str = "ORDER_API_TOKEN") -> int:
    accounts = Accounts()
    agent = build_agent(models, accounts, order_service_url, token_secret)
    with AgentRuntime(settings) as runtime:
        handle = runtime.start(agent, "Start triaging.")
        print(f"started {handle!r}")
        for message in ({"topic": "order", "text": "Where is order A-17?"},
                        {"topic": "account", "text": "What plan is ann on?"},
                        {"_signal": "stop"}):  # queued last: the listener ends once it has handled the others
            handle.send_message(message)
            print(f"sent {message}")
        result = handle.wait(timeout=180)
        answers = [(c.name, str(c.output.get("result"))) for c in result.tool_calls
                   if c.name in ("ask_orders", "ask_support") and c.status == "COMPLETED"]
        for name, answer in answers:
            print(f"{name} answered: {answer}")
        leaked = any(re.search(KEY_PATTERN, answer) for _, answer in answers)
        print(f"run ended {result.status.value}; accounts looked up in this process: {accounts.looked_up}; "
              f"key leaked: {leaked}")
        return 0 if result.ok and len(answers) == 2 and not leaked and accounts.looked_up else 1


# --- offline mode: a local order service and a scripted model ---------------------------------


class _Orders(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        order_id = urllib.parse.urlsplit(self.path).path.rsplit("/", 1)[-1]
        authorized = self.headers.get("Authorization") == f"Bearer {self.server.token}"  # type: ignore[attr-defined]
        body = json.dumps({"order_id": order_id, "status": "shipped" if authorized else "unauthorized"}).encode()
        self.send_response(200 if authorized else 401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def order_service(token: str) -> Iterator[str]:
    """A loopback order service that answers only requests bearing ``token``; yields its URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Orders)
    server.token = token  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, name="sample-order-service", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def scripted_models(llm: Any) -> Dict[str, str]:
    """What a real model would do, scripted: route by topic, look up, and revise a leaking answer."""
    from conductor_agents.testing import ToolCall, listener_policy

    def route(payload: Any) -> Optional[ToolCall]:
        if not isinstance(payload, dict):
            return None
        tool_name = "ask_orders" if payload.get("topic") == "order" else "ask_support"
        return ToolCall(tool_name, {"request": str(payload.get("text", ""))})

    def orders(request: Any) -> Any:
        if request.is_first_turn:
            found = re.search(r"[A-Z]-\d+", request.user_text)
            return ToolCall("get_order", {"order_id": found.group(0) if found else "unknown"})
        [out] = request.tool_outputs
        body = out.output["response"]["body"]
        return f"Order {body['order_id']} is {body['status']}."

    def support(request: Any) -> Any:
        if request.is_first_turn:
            return ToolCall("lookup_account", {"user": "ann"})
        if "Output validation failed" in request.user_text:
            return "Ann is on the pro plan; her account is active."
        account = request.all_tool_outputs[-1].output
        return f"Ann is on the {account['plan']} plan, key {account['api_key']}."  # the leak the guardrail stops

    return {"triage": llm.script(policy=listener_policy(route)), "orders": llm.script(policy=orders),
            "support": llm.script(policy=support)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--remote", action="store_true",
                        help="use CONDUCTOR_SERVER_URL, ORDER_SERVICE_URL and CONDUCTOR_AGENT_MODEL")
    args = parser.parse_args()
    if args.remote:
        model = os.environ.get("CONDUCTOR_AGENT_MODEL", "anthropic/claude-sonnet-4-6")
        models = {"triage": model, "orders": model, "support": model}
        return run_scenario(AgentSettings.from_env(), models, os.environ["ORDER_SERVICE_URL"])

    import contextlib
    import secrets

    from conductor_agents.testing import LocalStack

    token = secrets.token_hex(16)
    print("starting a local Conductor server with a scripted model...")  # a first run also says it downloads the jar
    with LocalStack(secrets={"ORDER_API_TOKEN": token}) as stack, \
            contextlib.contextmanager(order_service)(token) as url:
        print(f"server up at {stack.url}; order service at {url}")
        return run_scenario(stack.settings, scripted_models(stack.llm), url)


if __name__ == "__main__":
    raise SystemExit(main())
