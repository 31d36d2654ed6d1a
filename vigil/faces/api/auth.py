"""Who is asking, and may they: per-user bearer tokens stored hashed, four roles, the two-person rule.

Users live in a YAML file (``settings.users_file``, default ``<home>/users.yaml``; ``vigil users add``
writes it)::

    users:
      - {name: alice, role: approver, token_sha256: 9f86d0...}

Only the SHA-256 of each token is stored: tokens are 32 random bytes, so a plain hash is enough and a
stolen file gives no token. With users configured every /api/v1 route needs a token (reads: viewer).
Behind a reverse proxy that authenticates people (oauth2-proxy with OIDC, for example),
``settings.identity_header`` names the header the proxy sets (``X-Forwarded-User``); the user it names
is looked up in the same file for the role. The legacy shared ``api_token`` (deprecated: the server warns)
is one identity, ``api``, with the admin role, and the two-person rule holds for it as for anyone: what the
shared token proposed, the shared token cannot approve; a configured approver must.

With users or a token configured, every read needs credentials too: the REST reads, the cluster map and
its stream, the runs, and the dashboard's pages. A browser has no place for a header on a page load or an
EventSource, so the dashboard's sign-in form also stores the token in a ``vigil_token`` cookie
(``SameSite=Strict``); the cookie opens reads only. Writes take the token from the ``Authorization``
header alone, so a page from another site cannot make the browser write with it.
"""

from __future__ import annotations

import enum
import hashlib
import secrets
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import yaml
from fastapi import HTTPException, Request, status
from pydantic import BaseModel, Field, ValidationError

from vigil.config import Settings, read_yaml
from vigil.model import VigilInputError, describe_validation_error

SHARED_TOKEN_USER = "api"
TOKEN_COOKIE = "vigil_token"
SHARED_TOKEN_WARNING = (
    "api_token is one shared identity ('api'): it cannot tell people apart, and what it proposes it cannot "
    "approve; give each person a token with `vigil users add NAME --role ...`"
)


class Role(enum.IntEnum):
    """Each role may do what the roles below it may."""

    VIEWER = 1  # read everything
    OPERATOR = 2  # record incidents and events, propose and execute approved actions, run diagnoses
    APPROVER = 3  # approve proposed actions
    ADMIN = 4  # all of the above

    @property
    def label(self) -> str:
        return self.name.lower()


class User(BaseModel):
    model_config = {"extra": "forbid"}

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.@\-]{0,99}$")
    role: str = Field(pattern=r"^(viewer|operator|approver|admin)$")
    token_sha256: str = Field(default="", pattern=r"^([0-9a-f]{64})?$")

    @property
    def level(self) -> Role:
        return Role[self.role.upper()]


class UsersFile(BaseModel):
    model_config = {"extra": "forbid"}

    users: list[User] = Field(default_factory=list)


@dataclass(frozen=True)
class Identity:
    name: str
    role: Role


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    return "vgl_" + secrets.token_urlsafe(32)


def users_path(settings: Settings) -> Path:
    return settings.users_file or settings.home / "users.yaml"


def load_users(path: Path) -> list[User]:
    """The users file, checked whole: a duplicate name or a malformed entry is one line naming the file."""
    if not path.exists():
        return []
    loaded = read_yaml(path, "users file")
    try:
        users = UsersFile.model_validate(loaded or {}).users
    except ValidationError as err:
        raise VigilInputError(f"users file {path}: {describe_validation_error(err)}") from None
    names = [u.name for u in users]
    duplicate = next((n for n in names if names.count(n) > 1), None)
    if duplicate is not None:
        raise VigilInputError(f"users file {path}: user {duplicate!r} appears twice")
    return users


def save_users(path: Path, users: list[User]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = yaml.safe_dump({"users": [u.model_dump() for u in users]}, sort_keys=False)
    partial = path.with_suffix(".tmp")
    partial.write_text(text)
    partial.chmod(0o600)
    partial.replace(path)


class Authenticator:
    """Maps a request to an Identity. Built once per server from the settings and the users file."""

    def __init__(self, settings: Settings) -> None:
        self.users = load_users(users_path(settings))
        self.by_hash = {u.token_sha256: u for u in self.users if u.token_sha256}
        self.by_name = {u.name: u for u in self.users}
        self.shared_token = settings.api_token
        self.identity_header = settings.identity_header.lower()
        self.two_person_rule = settings.two_person_rule

    @property
    def users_configured(self) -> bool:
        return bool(self.users)

    @property
    def configured(self) -> bool:
        return self.users_configured or bool(self.shared_token)

    def identify(self, headers: Any, cookies: Mapping[str, str] | None = None) -> Identity | None:
        """The caller, or None when the request carries no credentials; a wrong token is a 401. ``cookies``
        (the dashboard's token cookie) are passed for reads only."""
        if self.identity_header:
            proxied = headers.get(self.identity_header)
            if proxied:
                user = self.by_name.get(proxied)
                if user is None:
                    raise HTTPException(status.HTTP_403_FORBIDDEN, f"user {proxied!r} has no role in the users file")
                return Identity(user.name, user.level)
        scheme, _, token = headers.get("authorization", "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            token = unquote(cookies.get(TOKEN_COOKIE, "")).strip() if cookies else ""
            if not token:
                return None
        user = self.by_hash.get(hash_token(token))
        if user is not None:
            return Identity(user.name, user.level)
        if self.shared_token and secrets.compare_digest(token.encode(), self.shared_token.encode()):
            return Identity(SHARED_TOKEN_USER, Role.ADMIN)
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "bearer token does not match any user",
                            headers={"WWW-Authenticate": "Bearer"})

    def may_approve(self, approver: Identity, proposer: str) -> bool:
        """The two-person rule: whoever proposed a destructive action may not approve it too. It holds for the
        shared token and the local MCP user as well: each is one identity, whoever holds it."""
        return not (self.two_person_rule and approver.name == proposer)


# The caller of the MCP tool being run: set by the HTTP gate per request; over stdio the local user, who
# already holds the store, acts as one shared identity.
mcp_caller: ContextVar[Identity | None] = ContextVar("mcp_caller", default=None)
LOCAL_MCP_USER = Identity("mcp", Role.ADMIN)


def mcp_identity() -> Identity:
    return mcp_caller.get() or LOCAL_MCP_USER


def _authenticator(request: Request) -> Authenticator:
    auth: Authenticator = request.app.state.ctx.auth
    return auth


def _require(request: Request, role: Role) -> Identity:
    auth = _authenticator(request)
    if role > Role.VIEWER and not auth.configured:
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            "mutating endpoints are disabled: add users (`vigil users add NAME --role operator`) or set "
            "VIGIL_API_TOKEN on the server",
        )
    who = auth.identify(request.headers, request.cookies if role == Role.VIEWER else None)
    if who is None:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "missing bearer token: send 'Authorization: Bearer <token>'",
            headers={"WWW-Authenticate": "Bearer"},
        )
    if who.role < role:
        raise HTTPException(status.HTTP_403_FORBIDDEN,
                            f"user {who.name!r} is {who.role.label}; this needs {role.label} or above")
    return who


async def check_read(request: Request) -> None:
    """Reads are open until users or a token are configured; then every read needs a token (header or the
    dashboard's cookie)."""
    if _authenticator(request).configured:
        _require(request, Role.VIEWER)


class SignInRequired(Exception):
    """A dashboard page asked for without credentials (or with wrong ones): answered with the sign-in page."""

    def __init__(self, reason: str, status_code: int) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status_code = status_code


async def check_page(request: Request) -> None:
    """The dashboard's pages: as ``check_read``, but a person without credentials gets a sign-in form."""
    try:
        await check_read(request)
    except HTTPException as err:
        raise SignInRequired(str(err.detail), err.status_code) from None


async def check_operator(request: Request) -> Identity:
    return _require(request, Role.OPERATOR)


async def check_approver(request: Request) -> Identity:
    return _require(request, Role.APPROVER)
