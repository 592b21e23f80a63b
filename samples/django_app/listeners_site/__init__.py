"""Stateful listeners behind a Django API, served by several worker processes (see ``serve.py``)."""
