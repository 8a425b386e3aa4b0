"""The fake Anthropic Messages API: a loopback test double and demo aid (scenarios, faults, the
wire protocol, `runrow fake-model`).

Imports nothing of the worker or the agent; only tests, the demo and the CLI import it.
"""
