"""Parameter masking: replace the variable parts of a log line (ids, addresses, numbers, paths) by ``<*>``.

One compiled alternation, anchored at token starts, runs over a whole block of lines in a single C-level
``re.sub`` call; that is what makes the miner fast (no Python work per token). Every alternative is
general (no per-system rule): the shapes of timestamps, addresses, hex ids, paths and any token that
holds a digit, which in log statements is almost always a value rather than part of the text.
"""

from __future__ import annotations

import re

WILDCARD = "<*>"

_WEEKDAY = r"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)"
_MONTH = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)"

# Patterns never cross a newline, so a block of lines masks exactly like each line alone.
# Order matters: the alternation tries them left to right at each token start.
_ALTERNATIVES = [
    # The value of a key=value or key:value pair (the key is text and stays).
    r"(?<=[\w.\-][=:])[^\s,;)\]}>]+",
    # syslog / ctime dates: "Sun Jul 17 03:04:05 2005", "Jul 17 03:04:05". Digit counts are left open
    # (\d+, never \d{2}) so that lines differing only in the width of a number mask alike.
    rf"(?:{_WEEKDAY},?[ \t]+)?{_MONTH}[ \t]+\d+(?:,?[ \t]+\d+)?"
    r"(?:[ \t]+\d+:\d+(?::\d+)?(?:[.,]\d+)?)?(?:[ \t]+\d+)?",
    # URLs and absolute or home-relative paths (no digit needed: file names are values).
    r"[A-Za-z][A-Za-z0-9+.\-]*://\S+",
    r"[\[(<'\"]?~?/(?:[^\s/]+/)+[^\s]*",
    # Host and file names: dotted words ending in a short lowercase suffix (adelphia.net, libc.so, x.log).
    r"[\w\-]+(?:\.[\w\-]+)*\.[a-z]{2,4}(?=[\s)\]}>\"',;:]|$)",
    # Any token that contains a digit: numbers, ids, IPs, hex, versions, sizes, durations.
    r"[^\s\d()\[\]{}<>\"',;:=]*+\d[^\s()\[\]{}<>\"',;:=]*+",
]

_TOKEN_MASK = re.compile(r"(?<![^\s(\[{<\"',;:=])(?:" + "|".join(_ALTERNATIVES) + ")")
_REPEATED_WILDCARD = re.compile(r"<\*>(?:[ \t,:;]*<\*>)+")


def mask(text: str) -> str:
    """Mask one line or a block of newline-separated lines (newlines are kept)."""
    masked = _TOKEN_MASK.sub(WILDCARD, text)
    return _REPEATED_WILDCARD.sub(WILDCARD, masked)


def tokenize(masked_line: str) -> list[str]:
    """Whitespace tokens of a masked line; runs of wildcards are already collapsed by :func:`mask`."""
    return masked_line.split()
