"""A terminal chat with a stateful agent: each line you type is a message, it answers with a tool.

The agent loops on ``wait_for_message``; every line typed here is pushed into its run with
``send_message``, and it answers by calling a ``reply(text)`` tool, which runs in *this*
process (the run is stateful) and prints the text. An empty line does nothing; ``/quit``,
Ctrl-D or the end of piped input stops the run gracefully.

Run it offline (a real Conductor server on this machine, with a scripted model that echoes):

    python samples/chat_repl.py
    printf 'hello\\nhow are you?\\n' | python samples/chat_repl.py     # works piped, too

Or against your own server and a real model:

    CONDUCTOR_SERVER_URL=http://localhost:8080/api \\
    CONDUCTOR_AGENT_MODEL=anthropic/claude-sonnet-4-6 python samples/chat_repl.py --remote
"""

from __future__ import annotations

import argparse
import os
import queue
import sys
from typing import TextIO

from conductor_agents import Agent, AgentRuntime, AgentSettings, ToolRegistry, WaitForMessageTool, tool

REPLY_TIMEOUT = 60.0


class ChatTools:
    """The agent's way of talking back. Replies land on a queue so the prompt waits for them."""

    def __init__(self) -> None:
        self.replies: "queue.Queue[str]" = queue.Queue()

    @tool
    def reply(self, text: str) -> dict:
        """Say something to the user at the terminal."""
        print(f"agent> {text}", flush=True)
        self.replies.put(text)
        return {"delivered": True}


def build_agent(model: str, tools: ChatTools) -> Agent:
    return Agent(
        name="chat_repl",
        model=model,
        stateful=True,
        max_turns=10_000,
        tools=[
            WaitForMessageTool.create(name="wait_for_message",
                                      description="Wait for the user's next chat message."),
            *ToolRegistry.from_instance(tools),
        ],
        instructions="You are a friendly assistant in a terminal chat. Loop: wait_for_message, then "
                     "answer the message with exactly one call to reply(text). Repeat until told to stop.",
    )


def chat(settings: AgentSettings, model: str, lines: TextIO = sys.stdin) -> int:
    interactive = lines.isatty()
    tools = ChatTools()
    with AgentRuntime(settings) as runtime:
        handle = runtime.start(build_agent(model, tools), "A user opened the chat.")
        print(f"chatting with execution {handle.execution_id} (/quit or Ctrl-D to leave)", flush=True)
        while True:
            if interactive:
                print("you> ", end="", flush=True)
            line = lines.readline()
            if not line or line.strip() == "/quit":
                break
            text = line.strip()
            if not text:
                continue
            if not interactive:
                print(f"you> {text}", flush=True)
            handle.send_message(text)  # a string arrives as {"message": text}
            try:
                tools.replies.get(timeout=REPLY_TIMEOUT)
            except queue.Empty:
                print(f"(no reply within {REPLY_TIMEOUT:g}s)", flush=True)
        handle.stop()
        result = handle.wait(timeout=120)
        print(f"chat ended: {result.status.value}", flush=True)
        return 0 if result.ok else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--remote", action="store_true",
                        help="use CONDUCTOR_SERVER_URL and CONDUCTOR_AGENT_MODEL instead of a local server")
    args = parser.parse_args()
    if args.remote:
        return chat(AgentSettings.from_env(), os.environ.get("CONDUCTOR_AGENT_MODEL", "anthropic/claude-sonnet-4-6"))

    from conductor_agents.testing import LocalStack, ToolCall, listener_policy

    print("starting a local Conductor server with a scripted model...", flush=True)  # a first run also says it downloads the jar
    with LocalStack() as stack:
        # The scripted model answers every message by echoing it through reply().
        model = stack.llm.script(policy=listener_policy(
            lambda payload: ToolCall("reply", {"text": f"you said: {payload.get('message', payload)}"})
        ))
        return chat(stack.settings, model)


if __name__ == "__main__":
    raise SystemExit(main())
