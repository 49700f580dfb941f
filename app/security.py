"""API-key check: a FastAPI dependency put on every router except health/ready."""

from __future__ import annotations

import hmac

from fastapi import Depends, Request

from app.errors import ApiError
from app.settings import Settings, get_settings


def require_api_key(request: Request, settings: Settings = Depends(get_settings)) -> None:
    """Pass when no API key is configured or the request carries ``Authorization: Bearer <key>``."""
    if settings.api_key is None:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    expected = settings.api_key.get_secret_value()
    if scheme.lower() != "bearer" or not token.strip():
        message = "missing bearer token: send 'Authorization: Bearer <key>'"
    elif not hmac.compare_digest(token.strip().encode(), expected.encode()):
        message = "wrong bearer token"
    else:
        return
    raise ApiError(401, "unauthorized", message, headers={"WWW-Authenticate": "Bearer"})
