"""Run handlers shipped with runrow (the agent loop is pyworker.agent:handle)."""
