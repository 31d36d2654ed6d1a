"""Bearer-token check for mutating endpoints: reads are open, writes need settings().api_token."""

from __future__ import annotations

import secrets

from fastapi import HTTPException, Request, status


async def check_token(request: Request) -> str:
    """Returns who asked (for the audit trail); 401 without a valid token, 403 when writes are disabled."""
    expected: str = request.app.state.ctx.settings.api_token
    if not expected:
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            "mutating endpoints are disabled: set VIGIL_API_TOKEN (settings api_token) on the server",
        )
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "missing bearer token: send 'Authorization: Bearer <api_token>'",
            headers={"WWW-Authenticate": "Bearer"},
        )
    if not secrets.compare_digest(token.strip().encode(), expected.encode()):
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "bearer token does not match",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return request.headers.get("x-vigil-user", "api")[:100] or "api"
