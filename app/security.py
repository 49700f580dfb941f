"""API-key check: a FastAPI dependency put on every router except health/ready."""

from __future__ import annotations

import hmac

from fastapi import Depends, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from app.errors import ApiError
from app.settings import Settings, get_settings

# Declares the bearer scheme in the OpenAPI document; the check itself is below (auto_error off,
# so that a missing token gets the service's own 401 body).
_bearer = HTTPBearer(auto_error=False, description="BART_OPT_API_KEY, when the server sets one")


def require_api_key(
    settings: Settings = Depends(get_settings),
    credentials: HTTPAuthorizationCredentials | None = Security(_bearer),
) -> None:
    """Pass when no API key is configured or the request carries ``Authorization: Bearer <key>``."""
    if settings.api_key is None:
        return
    if credentials is None or not credentials.credentials.strip():
        message = "missing bearer token: send 'Authorization: Bearer <key>'"
    elif not hmac.compare_digest(credentials.credentials.strip().encode(), settings.api_key.get_secret_value().encode()):
        message = "wrong bearer token"
    else:
        return
    raise ApiError(401, "unauthorized", message, headers={"WWW-Authenticate": "Bearer"})
