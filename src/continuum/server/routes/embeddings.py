"""``POST /v1/embeddings``, with the server's embedder (``continuum serve --semantic``)."""

from __future__ import annotations

import base64
from typing import Any

from fastapi import APIRouter, Request

from continuum.errors import InvalidRequest, UnknownModel
from continuum.server.deps import State, parse_body, run
from continuum.server.schemas import EmbeddingsRequest

router = APIRouter()


@router.post("/v1/embeddings")
async def embeddings(request: Request, state: State) -> dict[str, Any]:
    req = await parse_body(state, request, EmbeddingsRequest)
    embedder = state.embedder
    if embedder is None:
        raise InvalidRequest(
            "this server has no embedder; start it with `continuum serve --semantic`"
        )
    if req.model not in (embedder.name, embedder.identity, "continuum"):
        raise UnknownModel(req.model, [embedder.name])
    if req.encoding_format not in ("float", "base64"):
        raise InvalidRequest("encoding_format must be 'float' or 'base64'")
    texts = [req.input] if isinstance(req.input, str) else req.input
    vectors = await run(state, lambda: embedder.embed(texts))

    def encode(v: Any) -> Any:
        if req.encoding_format == "base64":  # little-endian float32, as OpenAI sends it
            return base64.b64encode(v.astype("<f4").tobytes()).decode()
        return [float(x) for x in v]

    return {
        "object": "list",
        "model": embedder.name,
        "data": [
            {"object": "embedding", "index": i, "embedding": encode(v)}
            for i, v in enumerate(vectors)
        ],
        "usage": {"prompt_tokens": 0, "total_tokens": 0},
    }
