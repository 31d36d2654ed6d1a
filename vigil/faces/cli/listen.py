"""Checks before a server binds: the port is free, and a warning when it listens beyond this machine
without authentication."""

from __future__ import annotations

import ipaddress
import socket

from rich.markup import escape

from vigil.faces.cli.output import SafeConsole
from vigil.model import VigilInputError


def ensure_port_free(host: str, port: int, what: str) -> None:
    """One line naming the port when another process holds it (uvicorn would print that it is serving,
    then exit 3)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as err:
        raise VigilInputError(f"{what}: cannot resolve host {host!r} ({err.strerror})") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        # The same option uvicorn sets, so a port in TIME_WAIT after a restart is not reported as taken.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as err:
            raise VigilInputError(f"{what}: port {port} on {host} is not available ({err.strerror})") from None


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def warn_if_open(host: str, authenticated: bool, what: str) -> None:
    if not is_loopback(host) and not authenticated:
        SafeConsole(stderr=True).print(
            f"[bold yellow]warning:[/] {what} listens on {escape(host)}, beyond this machine, without authentication: "
            "anyone who can reach it can read the cluster's state; configure users (docs/server.md, Access)",
            highlight=False,
            soft_wrap=True,
        )
