"""One :class:`fastapi.APIRouter` per API; :func:`continuum.server.app.create_app` includes them
all (``ROUTERS``, in this order)."""

from __future__ import annotations

from fastapi import APIRouter

from continuum.server.routes import (
    admin,
    chat,
    completions,
    embeddings,
    meta,
    responses,
    responses_socket,
    sessions,
)

ROUTERS: tuple[APIRouter, ...] = (
    meta.router,
    chat.router,
    completions.router,
    embeddings.router,
    sessions.router,
    responses.router,
    responses_socket.router,
    admin.router,
)
