"""`python -m tests.run.counted_connections ARGS` runs `vigil ARGS` and, at its exit, says on stderr how many database
connections its pools opened and never closed (``LINE`` and the count): the process's own view, since a connection
left open ends with the process all the same, and the database sees no difference once it has ended."""

from __future__ import annotations

import atexit
import sys
from typing import Any

from sqlalchemy import event
from sqlalchemy.pool import Pool

LINE = "database connections left open at exit: "

_open: set[int] = set()


def _opened(dbapi_connection: Any, _record: Any) -> None:
    _open.add(id(dbapi_connection))


def _closed(dbapi_connection: Any, *_: Any) -> None:
    _open.discard(id(dbapi_connection))


def left_open(lines: list[str]) -> int:
    """The count the process said at its exit (its stderr ``lines``)."""
    said = [line for line in lines if line.startswith(LINE)]
    assert said, "".join(lines)
    return int(said[-1].removeprefix(LINE))


if __name__ == "__main__":
    event.listen(Pool, "connect", _opened)
    event.listen(Pool, "close", _closed)
    event.listen(Pool, "close_detached", _closed)
    atexit.register(lambda: print(f"{LINE}{len(_open)}", file=sys.stderr, flush=True))
    from vigil.faces.cli.main import main

    sys.argv[0] = "vigil"
    main()
