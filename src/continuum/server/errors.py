"""How the server reports errors: one table from exception type to HTTP status and OpenAI error
type/code, and the OpenAI-shaped body every error is sent in.

Errors are matched by type, in table order (the first ``isinstance`` wins, so subclasses come
before their bases), never by message text. Anything that is not a
:class:`~continuum.errors.ContinuumError` is a ``500`` whose message says nothing of the cause,
and no message names a path on the server (:func:`public`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from fastapi.responses import JSONResponse

from continuum.errors import (
    BackendConfigError,
    BackendError,
    BundleCorrupt,
    BundleModelMismatch,
    BundleTenantMismatch,
    BundleVersion,
    ChatTemplateError,
    ContextOverflow,
    ContinuumError,
    Draining,
    EmbeddingError,
    InvalidRequest,
    MissingExtra,
    ModelFileError,
    Overloaded,
    SessionBusy,
    SessionClosed,
    SessionExists,
    SessionNotFound,
    SessionQuotaExceeded,
    ShuttingDown,
    SnapshotError,
    StoreError,
    StoreUnavailable,
    TurnConflict,
    UnknownModel,
)

log = logging.getLogger(__name__)


class ResponseNotFound(ContinuumError):
    """No stored response with this id in the caller's namespace."""

    def __init__(self, response_id: str) -> None:
        super().__init__(
            f"no stored response {response_id!r}: it was never stored (store: false), was "
            "deleted, or belongs to another tenant"
        )


class PreviousResponseNotFound(ResponseNotFound):
    """``previous_response_id`` names no stored response; never silently ignored."""


# exception type -> (HTTP status, OpenAI error type, code); matched by type, never by message
ERROR_TABLE: list[tuple[type[BaseException], int, str, str]] = [
    (Overloaded, 429, "rate_limit_error", "queue_full"),
    (Draining, 503, "server_error", "draining"),
    (ShuttingDown, 503, "server_error", "shutting_down"),
    (PreviousResponseNotFound, 404, "invalid_request_error", "previous_response_not_found"),
    (ResponseNotFound, 404, "invalid_request_error", "response_not_found"),
    (UnknownModel, 404, "invalid_request_error", "model_not_found"),
    (SessionQuotaExceeded, 429, "rate_limit_error", "session_quota_exceeded"),
    (SessionNotFound, 404, "invalid_request_error", "session_not_found"),
    (SessionExists, 409, "invalid_request_error", "session_exists"),
    (SessionBusy, 409, "invalid_request_error", "session_busy"),
    (TurnConflict, 409, "invalid_request_error", "turn_conflict"),
    (SessionClosed, 409, "invalid_request_error", "session_closed"),
    (ContextOverflow, 400, "invalid_request_error", "context_length_exceeded"),
    (ChatTemplateError, 400, "invalid_request_error", "chat_template_error"),
    (BundleTenantMismatch, 403, "invalid_request_error", "bundle_tenant_mismatch"),
    (BundleModelMismatch, 409, "invalid_request_error", "bundle_model_mismatch"),
    (BundleVersion, 400, "invalid_request_error", "bundle_version_unsupported"),
    (BundleCorrupt, 400, "invalid_request_error", "bundle_corrupt"),
    # a backend's configuration is the operator's, never the client's: not a 400
    (BackendConfigError, 500, "server_error", "backend_config_error"),
    (InvalidRequest, 400, "invalid_request_error", "invalid_request"),
    (EmbeddingError, 400, "invalid_request_error", "embedding_error"),
    (MissingExtra, 501, "server_error", "missing_extra"),
    (ModelFileError, 500, "server_error", "model_file_error"),
    (SnapshotError, 500, "server_error", "snapshot_error"),
    (StoreUnavailable, 503, "server_error", "store_unavailable"),
    (StoreError, 500, "server_error", "store_error"),
    (BackendError, 500, "server_error", "backend_error"),
    (ContinuumError, 500, "server_error", "internal_error"),
]


class ClientGone(ContinuumError):
    """Raised inside generation when the streaming client has disconnected."""


class BodyTooLarge(ContinuumError):
    """The request body is larger than the configured limit."""


def error_body(message: str, etype: str, code: str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": etype, "param": param, "code": code}}


def error_response(exc: BaseException) -> JSONResponse:
    for etype_, status, etype, code in ERROR_TABLE:
        if isinstance(exc, etype_):
            headers = {}
            if isinstance(exc, Overloaded):
                headers["Retry-After"] = str(exc.retry_after_s)
            return JSONResponse(error_body(public(exc), etype, code), status, headers=headers)
    log.error("unexpected error", exc_info=exc)
    return JSONResponse(error_body("internal server error", "server_error", "internal_error"), 500)


def public(exc: BaseException) -> str:
    """The message a client may see: a file's path (a store, a model, a snapshot) is cut to its
    name, and a shared store's address to its scheme (``redis``), since they tell a caller where
    things live on the server; the log keeps them whole."""
    message, path = str(exc), getattr(exc, "path", None)
    if isinstance(path, str) and path:
        log.warning("%s", message)
        shown = path.split("://", 1)[0] if "://" in path else Path(path).name
        message = message.replace(path, shown)
    return message


def too_large_response(max_body_bytes: int) -> JSONResponse:
    """``413``, for a declared Content-Length or a streamed body over the limit."""
    return JSONResponse(
        error_body(
            f"request body over {max_body_bytes} bytes", "invalid_request_error", "body_too_large"
        ),
        413,
    )


def refused(status: int, message: str, code: str) -> JSONResponse:
    """A request the guard in front of the routes turns away."""
    return JSONResponse(error_body(message, "invalid_request_error", code), status)


def bad_key_response() -> JSONResponse:
    return JSONResponse(
        error_body(
            "missing or invalid API key: send Authorization: Bearer <key>",
            "invalid_request_error",
            "invalid_api_key",
        ),
        401,
    )
