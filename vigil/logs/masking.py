"""Parameter masking: replace the variable parts of a log line (ids, addresses, numbers, paths) by ``<*>``.

One compiled alternation, anchored at token starts, runs over a whole block of lines in a single C-level
``re.sub`` call; that is what makes the miner fast (no Python work per token). Every alternative is
general (no per-system rule): the shapes of timestamps, addresses, hex ids, paths and any token that
holds a digit, which in log statements is almost always a value rather than part of the text - except a code
location as backtraces print it (``do_page_fault+0x12f/0x446``), where only the offset is a value.
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
# A code location as backtraces print it, symbol+offset[/size] in hex (the kernel's %pS / %pB, glibc's
# backtrace_symbols): in ``do_page_fault+0x12f/0x446`` the function is text and only the offset a value. Text that
# holds one ("+0x", a substring test) is masked by the same rules with that exception, one pass all the same.
_END = r"(?=[\s)\]}>\"',;:]|$)"
_HEX_OFFSET = r"0[xX][0-9A-Fa-f]+(?:/0[xX][0-9A-Fa-f]+)?" + _END
_CODE_LOCATION = r"[A-Za-z_][\w.$]*\+" + _HEX_OFFSET
_LOCATION_MASK = re.compile(
    r"(?<![^\s(\[{<\"',;:=])(?:" + "|".join(_ALTERNATIVES[:-1]) + "|(?!" + _CODE_LOCATION + ")" + _ALTERNATIVES[-1]
    + r")|(?<=[\w.$]\+)" + _HEX_OFFSET)


def _masker(text: str) -> re.Pattern[str]:
    return _LOCATION_MASK if "+0x" in text or "+0X" in text else _TOKEN_MASK


def mask(text: str) -> str:
    """Mask one line or a block of newline-separated lines (newlines are kept)."""
    masked = _masker(text).sub(WILDCARD, text)
    return _REPEATED_WILDCARD.sub(WILDCARD, masked)


def tokenize(masked_line: str) -> list[str]:
    """Whitespace tokens of a masked line; runs of wildcards are already collapsed by :func:`mask`."""
    return masked_line.split()


# ---------------------------------------------------------------------------------------------- template text
# How a template reads follows the conventions of the corrected Loghub ground truth (Khan et al., ICSE'22,
# "Guidelines for assessing the accuracy of log message template identification techniques"): a number that is
# a piece of its own between delimiters is a value even where it never varied; a path is a value; true, false,
# null and the default user names root and admin are values; a word glued to a value (no delimiter between) is
# part of it; values separated only by a dot or by nothing are one value. Words that merely contain a digit
# (``jk2_init``, ``ee0``, ``L3``) are text unless they vary.

_SEPARATORS = re.compile(r"[ \t,:;]*")
# a number standing alone between delimiters, with its sign ("-2", "blk_-17": the sign belongs to the number)
_NUMBER = re.compile(r"(?:(?<![A-Za-z0-9])-)?(?<![A-Za-z0-9_])(?:0[xX][0-9A-Fa-f]+|\d+)(?![A-Za-z0-9_])")
_PATH_PIECES = re.compile(r"""([\s,!;:=|"'\[\](){}]+)""")
_PATH = re.compile(r"(?:/[^/]+)+")
_PIECES = re.compile(r"""([\s,!;:=|"'\[\](){}.\-+@#$%&]+)""")
_NAMED_VALUES = frozenset({"true", "false", "null", "root", "admin"})
_NAMED = re.compile("|".join(_NAMED_VALUES), re.IGNORECASE)
_GLUED = re.compile(r"[^/]*<\*>[^/]*")
_DOTTED = re.compile(r"<\*>(?:\.<\*>)+")
DATE = re.compile(_ALTERNATIVES[1])
_ADJACENT = re.compile(r"(?:<\*>){2,}")


def values_of(line: str) -> list[str] | None:
    """The raw text behind each ``<*>`` of ``mask(line)``, in order; None when the line holds a ``<*>`` of its own."""
    if WILDCARD in line:
        return None
    spans: list[list[int]] = []
    for found in _masker(line).finditer(line):
        start, end = found.span()
        if spans and _SEPARATORS.fullmatch(line, spans[-1][1], start):
            spans[-1][1] = end  # runs of values are one value (_REPEATED_WILDCARD)
        else:
            spans.append([start, end])
    return [line[start:end] for start, end in spans]


def normalize_value(text: str) -> str:
    """``text`` with its paths, numbers, booleans, null and default user names made ``<*>`` (the pieces the
    conventions make values whether or not they vary)."""
    if "/" in text:
        text = "".join(WILDCARD if _PATH.fullmatch(piece) else piece for piece in _PATH_PIECES.split(text))
    text = _NUMBER.sub(WILDCARD, text)
    if _NAMED.search(text):
        text = "".join(WILDCARD if piece.lower() in _NAMED_VALUES else piece for piece in _PIECES.split(text))
    return text


def tidy(template: str) -> str:
    """A template's text in the conventions' form: :func:`normalize_value`, then a word glued to a value is part of
    it and values separated by a dot or by nothing are one."""
    template = normalize_value(template)
    if WILDCARD not in template:
        return template
    pieces = _PIECES.split(template)
    template = "".join(WILDCARD if WILDCARD in piece and piece != WILDCARD and _GLUED.fullmatch(piece) else piece
                       for piece in pieces)
    template = _DOTTED.sub(WILDCARD, template)
    return _ADJACENT.sub(WILDCARD, template)
