"""A separate process that sends messages to a listener as fast as it can (tests of continued listeners).

    python -m tests.integration.sender SERVER_URL EXECUTION_ID PREFIX COUNT

Sends ``{"action": "<PREFIX>-<i>"}`` for i in 0..COUNT-1 through its own AgentRuntime (the SDK's send
protocol), without pause, and prints one JSON line: the message ids, in order.
"""

import json
import sys

from conductor_agents import AgentRuntime, AgentSettings


def main() -> None:
    url, execution_id, prefix, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    with AgentRuntime(AgentSettings.from_env(environ={}, server_url=url)) as runtime:
        ids = [runtime.send_message(execution_id, {"action": f"{prefix}-{i}", "tag": prefix}) for i in range(count)]
    print(json.dumps({"sent": ids}), flush=True)


if __name__ == "__main__":
    main()
