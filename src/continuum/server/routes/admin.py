"""``POST /admin/drain``: move this worker's sessions out before it stops.

Every session's KV is written to the snapshot store (with ``--store redis://…``, the store the
fleet shares), new sessions are refused with 503 (``draining``) and ``/health`` answers 503, so
the router's health check sends traffic to another worker, which resumes each session from its
snapshot with no prefill (or rebuilds it from the shared history, visibly). SIGTERM does the
same parking as the server shuts down.

The admin routes take their own key (``serve --admin-key``), never a tenant's: a tenant must not
be able to take a worker out of the fleet. With no admin key configured they are refused.
"""

from __future__ import annotations

import hmac
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.requests import HTTPConnection

from continuum.server.deps import State, get_state, run
from continuum.server.errors import error_body

router = APIRouter()
PREFIX = "/admin/"


def is_admin(request: HTTPConnection) -> bool:
    """An admin route: its own key is checked by the route, not the tenants' guard."""
    return request.url.path.startswith(PREFIX)


def _refused(request: Request) -> JSONResponse | None:
    key = get_state(request).config.admin_key
    if key is None:
        return JSONResponse(
            error_body(
                "the admin routes are off: start serve with --admin-key (or send SIGTERM, "
                "which parks every session as the server stops)",
                "invalid_request_error",
                "admin_disabled",
            ),
            403,
        )
    scheme, _, presented = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(presented.strip(), key):
        return JSONResponse(
            error_body(
                "missing or invalid admin key: send Authorization: Bearer <admin key>",
                "invalid_request_error",
                "invalid_admin_key",
            ),
            401,
        )
    return None


@router.post("/admin/drain", response_model=None)
async def drain(request: Request, state: State) -> dict[str, Any] | JSONResponse:
    refused = _refused(request)
    if refused is not None:
        return refused
    state.draining = True  # first: no session is created after its KV would have been parked

    def park() -> int:
        return state.worker.park_all() if state.worker is not None else 0

    parked = await run(state, park, bounded=False)  # a full queue must not keep it from parking
    return {"status": "draining", "parked": parked}
