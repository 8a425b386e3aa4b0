"""The worker process and its parts: dispatcher, supervisor, heartbeat, journal writer, reaper,
the handler contract and the echo handler.

Imports only pyworker.db. Never the agent (handlers are loaded by name), HTTP, CLI, demo or fake.
"""
