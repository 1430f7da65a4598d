"""``GET /v1/models``, ``GET /metrics`` (Prometheus) and ``GET /health`` (the one route an API
key does not guard)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from continuum.server.deps import State

router = APIRouter()


@router.get("/health")
async def health(state: State) -> dict[str, Any]:
    return {"status": "ok", "model": state.model_id, "queue_depth": state.executor.depth}


@router.get("/metrics")
async def metrics(state: State) -> Response:
    state.metrics.observe_state(state)
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
