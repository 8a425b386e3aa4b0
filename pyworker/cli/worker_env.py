"""What `runrow worker` reads from its environment besides its flags' defaults: the block of its
--help, and the check that the agent loop has a model to call."""

from __future__ import annotations

import os

from pyworker.cli.types import MAX_SDK_RETRIES

ENVIRONMENT = f"""\
environment:
  ANTHROPIC_API_KEY         the key of the agent loop's model calls (--handler pyworker.agent:handle)
  ANTHROPIC_BASE_URL        the Messages API to call instead of the real one: a gateway, or
                            `runrow fake-model` (then no key is needed); the worker does not
                            start with the agent handler and neither of these two set
  RUNROW_MAX_RETRIES        the Anthropic client's retries of one request, 0 to {MAX_SDK_RETRIES} (default 2)
  DATABASE_URL              the database when --database-url is not given (else the
                            `runrow db start` cluster); PG* variables (PGPASSWORD, PGSSLMODE, ...)
                            apply as libpq reads them; PGOPTIONS joins the session limits
  OTEL_TRACES_EXPORTER      console or otlp: traces of the runs (the otel extra);
                            OTEL_SERVICE_NAME (default runrow) and the SDK's other OTEL_* too
  RUNROW_DEMO_DIR, RUNROW_DEMO_TOOL_DELAY
                            the folder and the delay of --tools pyworker.demo.tools
  RUNROW_LOG_LEVEL, RUNROW_LOG_FORMAT, RUNROW_CONCURRENCY, RUNROW_HANDLER, RUNROW_TOOLS,
  RUNROW_MAX_MODEL_CALLS, RUNROW_LISTEN_URL, RUNROW_WEBHOOK_*, RUNROW_ALLOW_PRIVATE_WEBHOOKS
                            the defaults of the flags that name them above (a flag wins)"""

AGENT_PACKAGE = "pyworker.agent"


def model_key_problem(handler: object) -> str | None:
    """Why the agent loop could not call its model, or None. Without a key or another endpoint
    the client calls api.anthropic.com without credentials: such a worker claimed every run it
    could and failed each ("model API unreachable", or a 401), runs a well-configured worker of
    the fleet would have done. Refused at start, where a deployment sees it, not warned of in a
    log line nobody reads while the queue drains into failures."""
    if not getattr(handler, "__module__", "").startswith(AGENT_PACKAGE):
        return None  # a handler of its own: whether it calls a model is not ours to know
    return model_api_problem("the agent handler", "every run would fail", ", or give a --handler of your own")


def model_api_problem(who: str, otherwise: str, or_else: str = "") -> str | None:
    """Why `who` (a command that calls the Messages API through the SDK's client) cannot call
    it, or None: neither ANTHROPIC_API_KEY nor ANTHROPIC_BASE_URL is set. `runrow worker` and
    `runrow replay` say it the same way, before they do any work."""
    if os.environ.get("ANTHROPIC_API_KEY") or os.environ.get("ANTHROPIC_BASE_URL"):
        return None
    token = (
        " (ANTHROPIC_AUTH_TOKEN is set, but runrow's client sends ANTHROPIC_API_KEY only)"
        if os.environ.get("ANTHROPIC_AUTH_TOKEN")
        else ""
    )
    return (
        f"{who} calls the Anthropic Messages API, and neither ANTHROPIC_API_KEY nor "
        f"ANTHROPIC_BASE_URL is set: {otherwise}. Set ANTHROPIC_API_KEY (or "
        f"ANTHROPIC_BASE_URL for a gateway or `runrow fake-model`){or_else}" + token
    )
