"""``GET /auth``: is this bearer token right? The dashboard's sign-in."""

from __future__ import annotations

from fastapi import APIRouter, Response

router = APIRouter(tags=["auth"])


@router.get("/auth", status_code=204, response_class=Response,
            responses={204: {"description": "The token is right, or the service has no API key"}})
async def auth() -> Response:
    """204 when the request may use the API (its router checks the key), 401 otherwise.

    It reads neither the model nor the jobs database, so a client can sign in while either is down.
    """
    return Response(status_code=204)
