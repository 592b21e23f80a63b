"""``python -m conductor_agents``: the command line."""

from conductor_agents.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
