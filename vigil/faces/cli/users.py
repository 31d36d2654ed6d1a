"""`vigil users ...`: the people who may use the REST API and MCP server, each with a role and a token."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from vigil.faces.cli.output import DataTable, SafeConsole, json_text
from vigil.model import VigilInputError

app = typer.Typer(help="Users of the API: roles (viewer, operator, approver, admin) and tokens.", no_args_is_help=True)
console = SafeConsole()
FileOption = Annotated[Path | None, typer.Option("--file", help="users file (default: settings users_file or "
                                                  "<home>/users.yaml)")]


def _path(file: Path | None) -> Path:
    from vigil.config import settings
    from vigil.faces.api.auth import users_path

    path = file or users_path(settings())
    if path.exists() and not path.is_file():
        raise VigilInputError(f"users file {path} is not a file")
    return path


@app.command("add")
def add_command(
    name: Annotated[str, typer.Argument(help="user name (letters, digits, _ . @ -)")],
    role: Annotated[str, typer.Option("--role", help="viewer, operator, approver or admin")],
    file: FileOption = None,
    replace: Annotated[bool, typer.Option("--replace", help="give an existing user a new token and role")] = False,
) -> None:
    """Add a user and print their token once; only its SHA-256 is stored."""
    from pydantic import ValidationError

    from vigil.faces.api.auth import User, hash_token, load_users, new_token, save_users
    from vigil.model import describe_validation_error

    path = _path(file)
    users = load_users(path)
    token = new_token()
    try:
        user = User(name=name, role=role.lower(), token_sha256=hash_token(token))
    except ValidationError as err:
        raise VigilInputError(f"bad user: {describe_validation_error(err)}") from None
    if any(u.name == name for u in users) and not replace:
        raise VigilInputError(f"user {name!r} already exists in {path}; pass --replace to issue a new token")
    save_users(path, [u for u in users if u.name != name] + [user])
    SafeConsole(stderr=True).print(f"added {name} ({user.role}) to {path}; the token is shown once:", highlight=False,
                                   markup=False)
    typer.echo(token)


@app.command("list")
def list_command(
    file: FileOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """Users and their roles (never their tokens)."""
    from vigil.faces.api.auth import load_users

    users = load_users(_path(file))
    if as_json:
        typer.echo(json_text([{"name": u.name, "role": u.role, "has_token": bool(u.token_sha256)} for u in users]))
        return
    table = DataTable("user", "role", "token", title=f"{len(users)} users")
    for u in users:
        table.add_row(u.name, u.role, "set" if u.token_sha256 else "proxy only")
    console.print(table)
