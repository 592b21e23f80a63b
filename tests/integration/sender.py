"""A separate process that sends messages to a listener as fast as it can (tests of continued listeners).

    python -m tests.integration.sender SERVER_URL EXECUTION_ID PREFIX COUNT [stop]

Sends ``{"action": "<PREFIX>-<i>"}`` for i in 0..COUNT-1 through its own AgentRuntime (the SDK's send
protocol), without pause, and prints one JSON line: the message ids, in order. With ``stop``, it then stops the
listener (holding only its id) and asks, for each message, whether it was delivered: ``"outcomes"`` in the line,
``"delivered"`` or the ``MessageLostError`` reason of each.
"""

import json
import sys

from conductor_agents import AgentRuntime, AgentSettings, MessageLostError


def main() -> None:
    url, execution_id, prefix, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    stop = sys.argv[5:] == ["stop"]
    with AgentRuntime(AgentSettings.from_env(environ={}, server_url=url)) as runtime:
        ids = [runtime.send_message(execution_id, {"action": f"{prefix}-{i}", "tag": prefix}) for i in range(count)]
        line: dict = {"sent": ids}
        if stop:
            runtime.attach(execution_id).stop()
            outcomes = []
            for message_id in ids:
                try:
                    runtime.wait_delivered(execution_id, message_id, timeout=60)
                    outcomes.append("delivered")
                except MessageLostError as err:
                    outcomes.append(err.reason)
            line["outcomes"] = outcomes
    print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
