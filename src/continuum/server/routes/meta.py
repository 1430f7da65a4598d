"""``GET /v1/models``, ``GET /metrics`` (Prometheus) and ``GET /health`` (the one route an API
key does not guard)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from continuum.server.deps import State

router = APIRouter()


@router.get("/health", response_model=None)
async def health(state: State) -> dict[str, Any] | JSONResponse:
    """What a router's health check reads: 503 while draining, so traffic moves away."""
    body = {"status": "ok", "model": state.model_id, "queue_depth": state.executor.depth}
    if state.draining:
        return JSONResponse({**body, "status": "draining"}, 503)
    return body


@router.get("/metrics")
async def metrics(state: State) -> Response:
    worker = state.worker
    drafts = None
    if worker is not None:  # the lanes' scheduler's, or the one context's (--parallel 1)
        steps = worker.scheduler
        drafts = (
            steps.draft_stats if steps is not None else getattr(worker.backend, "draft_stats", None)
        )
    state.metrics.observe_gauges(
        None if worker is None else len(worker.sessions()),
        state.engine.snapshots.stats(),
        state.executor.depth,
        drafts,
        None if worker is None else worker.borrowed,
    )
    return Response(generate_latest(state.registry), media_type=CONTENT_TYPE_LATEST)


@router.get("/v1/models")
async def models(state: State) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [
            {
                "id": state.model_id,
                "object": "model",
                "created": 0,
                "owned_by": "continuum",
                "continuum": {
                    "digest": state.engine.model_identity,
                },
            }
        ],
    }
