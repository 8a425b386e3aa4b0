"""A response's tokens are counted once in runrow_model_tokens, also when the run's own task is
cancelled in the same turn of the event loop as the response completes (the review of c160ad2:
stream_turn's CancelledError path counted what the finished stream had counted already)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from prometheus_client import REGISTRY

from pyworker.agent import model as model_module
from pyworker.agent.model import ModelTurn, Received, stream_turn
from pyworker.worker import metrics

USAGE = {"input_tokens": 7, "output_tokens": 3}


def input_tokens() -> float:
    return (
        REGISTRY.get_sample_value("runrow_model_tokens_total", {"model": "claude-fake-1", "kind": "input"})
        or 0.0
    )


async def test_a_response_that_completes_as_its_task_is_cancelled_is_counted_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    outer: asyncio.Task[ModelTurn] | None = None

    async def consume(
        client: Any, params: dict[str, Any], journal: Any, received: Received, on_headers: Any = None
    ) -> ModelTurn:
        received.usage = dict(USAGE)
        metrics.model_usage(params["model"], USAGE)  # as _consume counts a finished response
        assert outer is not None
        outer.cancel()  # the run's task is cancelled as the response completes
        return ModelTurn(
            message={"id": "msg_1", "role": "assistant", "content": [], "model": "claude-fake-1"},
            content_text="[]",
            stop_reason="end_turn",
            usage=dict(USAGE),
            request_id="req_1",
        )

    monkeypatch.setattr(model_module, "_consume", consume)
    monkeypatch.setattr(metrics, "_known_models", frozenset({"claude-fake-1"}))  # as if priced
    before = input_tokens()
    outer = asyncio.create_task(stream_turn(None, {"model": "claude-fake-1"}, None, asyncio.Event()))  # type: ignore[arg-type]
    with pytest.raises(asyncio.CancelledError):
        await outer
    assert input_tokens() - before == USAGE["input_tokens"]
