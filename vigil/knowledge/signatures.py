"""THE log-signature library (``data/kb/signatures.yaml``): its typed loader and the matcher every stage uses.

``signature_library()`` gives every :class:`Signature` in match order, checked: unique ids, patterns that
compile, faults that name a fault type or finding of the fault catalogue (the one fault vocabulary).
:class:`SignatureMatcher` finds the first signature a line matches; an NVRM Xid line takes its fault, level and
action from THE Xid table (:mod:`vigil.knowledge.xid`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, field_validator

from vigil.knowledge.faults import load_fault_catalogue
from vigil.knowledge.files import kb_dir, read_data
from vigil.knowledge.xid import parse_xid_line, xid_info
from vigil.model import FaultLevel, VigilInputError

Role = Literal["root", "cascade"]
# Xid lines take fault and level from THE Xid table; the codes the catalogue documents as the consequence of another
# error (45, 154) have a signature of their own, with role cascade, ahead of the general one.
XID_SIGNATURES = frozenset({"nvrm.xid", "nvrm.xid_consequence"})

# A line longer than this is matched on its head and tail only: error text is never megabytes long,
# and regexes over a 1 MB line would turn one hostile line into seconds of work.
MAX_MATCH_CHARS = 4096
# RE2's memory budget for the combined screen. Its lazily built DFA needs more states as the library grows; past the
# default (8 MiB) RE2 logs "DFA out of memory" and falls back to its NFA for the line, several times slower. With 153
# signatures 16 MiB suffices on the loghub corpora (tests/logs/test_signatures.py); this leaves room to grow.
SCREEN_MAX_MEM = 32 << 20


class Signature(BaseModel):
    """One known error line: what it looks like, what it establishes (``fault``) and the RCA symptom it is."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    pattern: str
    level: FaultLevel
    role: Role
    description: str
    fault: str | None = None
    symptom: str | None = None
    fallback: bool = False

    @field_validator("level", mode="before")
    @classmethod
    def _level_by_name(cls, value: Any) -> Any:
        return FaultLevel.parse(value) if isinstance(value, str) else value

    @property
    def regex(self) -> re.Pattern[str]:
        return _compiled(self.pattern)

    @property
    def kind(self) -> str:
        """What the line reports, for grouping reports of one failure: its fault, else its symptom, else its id."""
        return self.fault or self.symptom or self.id


class SignatureFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: int
    signatures: list[Signature]


@lru_cache(maxsize=512)
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


def load_signature_file(directory: Path | None = None) -> SignatureFile:
    """Read and check ``signatures.yaml`` in ``directory`` (the shipped knowledge base by default); every problem
    is one VigilInputError naming the file and the entry."""
    base = directory or kb_dir()
    where = base / "signatures.yaml"
    loaded = read_data(where, SignatureFile, "signature library")
    catalogue = load_fault_catalogue(base)
    seen: set[str] = set()
    for signature in loaded.signatures:
        if signature.id in seen:
            raise VigilInputError(f"signature library {where}: id {signature.id!r} appears twice")
        seen.add(signature.id)
        if signature.fault is not None and signature.fault not in catalogue.faults \
                and signature.fault not in catalogue.findings:
            raise VigilInputError(f"signature library {where}: {signature.id}: fault {signature.fault!r} is neither "
                                  "a fault type nor a finding of the fault catalogue")
        try:
            _compiled(signature.pattern)
        except re.error as err:
            raise VigilInputError(f"signature library {where}: {signature.id}: bad regular expression ({err})") \
                from None
    return loaded


@lru_cache(maxsize=1)
def signature_library() -> list[Signature]:
    """The shipped library, in match order (specific before generic)."""
    return load_signature_file().signatures


@dataclass(frozen=True)
class SignatureHit:
    """A line that matched a signature; an Xid line's ``fault`` and ``level`` come from the Xid table."""

    signature: Signature
    fault: str | None
    level: FaultLevel
    attrs: dict[str, Any] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        return self.fault or self.signature.kind


def _screen(pattern: str) -> Any:
    """The combined screen, compiled with RE2 where it accepts the pattern: RE2 tries every alternative in
    one linear pass, where Python's backtracking engine tries them one by one at every position (12x slower
    per line on 32 signatures). A pattern RE2 cannot compile (look-arounds, back-references) keeps ``re``;
    the screen only decides which lines the signatures are tried on, both engines agree on that
    (tests/logs/test_signatures.py). RE2 gets ``SCREEN_MAX_MEM`` for its DFA."""
    try:
        import re2
    except ImportError:
        return re.compile(pattern)
    options = re2.Options()
    options.max_mem = SCREEN_MAX_MEM
    try:
        return re2.compile(pattern, options)
    except re2.error:
        return re.compile(pattern)


# a character RE2 and Python's ``re`` may read apart: an ASCII control but the tab (a vertical tab is ``\s`` to ``re``
# alone, a line end moves ``$``), a lone surrogate (no UTF-8 for RE2), and a non-ASCII word or space character (``\d``,
# ``\w``, ``\s``, ``\b`` are Unicode to ``re``, ASCII to RE2; the letters Unicode folds to ASCII ones, such as the
# long s and the Kelvin sign, are word characters)
_READ_APART = re.compile(r"[\x00-\x08\n-\x1f\x7f\ud800-\udfff]|(?![\x00-\x7f])[\w\s]")


def re2_reads_alike(line: str) -> bool:
    """Whether RE2 and Python's ``re`` read ``line`` alike: printable ASCII with tabs, and beside it only non-ASCII
    characters that are neither word nor space characters to ``re`` (a progress bar's blocks, box drawing, an ellipsis),
    which are none of ``\\d``, ``\\w``, ``\\s`` to either engine (``_READ_APART``)."""
    if line.isascii():
        return line.replace("\t", " ").isprintable()
    return _READ_APART.search(line) is None


# A letter of another script (CJK, Cyrillic, an accented Latin one) is ``\w`` to ``re`` alone, so a line holding one
# was screened by ``re`` (0.1-0.5 ms a line, not 3 us). To ``re`` such a letter - a word character, no digit, folding
# to no ASCII character under ``(?i)`` - is what ``LETTER_PROXY`` is to every construct but a literal or a negated
# class holding it: the line with its letters made the proxy matches at least what the line does (``re2_screen_line``).
LETTER_PROXY = "q"
_PLAIN_LETTER = re.compile(r"(?![\x00-\x7f]|\d|(?i:[a-z]))\w")


def proxies_letters(patterns: Iterable[str]) -> bool:
    """Whether RE2 may screen a line for ``patterns`` with its plain letters made ``LETTER_PROXY``: ASCII patterns
    with no look-around (whose negation a wider match would turn), no ASCII-only flag (``\\W`` matching a letter, not
    the proxy) and no negated class holding the proxy in either case (``[^q]`` matches a Chinese letter only)."""
    from re import _constants as sre  # type: ignore[attr-defined]
    from re import _parser as sre_parse  # type: ignore[attr-defined]

    proxy = {ord(LETTER_PROXY.lower()), ord(LETTER_PROXY.upper())}

    def holds_proxy(items: list[Any]) -> bool:
        held = {arg for op, arg in items if op is sre.LITERAL}
        held.update(c for op, arg in items if op is sre.RANGE for c in proxy if arg[0] <= c <= arg[1])
        return bool(held & proxy)

    def safe(node: Any) -> bool:
        if isinstance(node, sre_parse.SubPattern):
            for op, arg in node.data:
                if op in (sre.ASSERT, sre.ASSERT_NOT) or (op is sre.NOT_LITERAL and arg in proxy) \
                        or (op is sre.IN and arg and arg[0][0] is sre.NEGATE and holds_proxy(arg[1:])) \
                        or (op is sre.SUBPATTERN and arg[1] & sre.SRE_FLAG_ASCII) or not safe(arg):
                    return False
        elif isinstance(node, (tuple, list)):
            return all(safe(item) for item in node)
        return True

    def parsed(pattern: str) -> Any:
        try:
            tree = sre_parse.parse(pattern)
        except re.error:
            return None
        return None if tree.state.flags & sre.SRE_FLAG_ASCII else tree

    return all(p.isascii() and (tree := parsed(p)) is not None and safe(tree) for p in patterns)


def re2_screen_line(line: str, letters: bool) -> str | None:
    """The line RE2 may screen in place of ``line``, Python's ``re`` deciding each signature it names: ``line`` when
    the engines read it alike; with ``letters`` (``proxies_letters`` held for the patterns), ``line`` with its plain
    letters made ``LETTER_PROXY`` when that is read alike, which matches at least the patterns ``line`` does;
    else None (a digit of another script, a no-break space: the line is tried against every signature)."""
    if re2_reads_alike(line):
        return line
    if not letters:
        return None
    proxied = _PLAIN_LETTER.sub(LETTER_PROXY, line)
    return proxied if re2_reads_alike(proxied) else None


def any_of(patterns: Iterable[str]) -> str:
    """One pattern that matches where any of ``patterns`` does. A pattern's leading ``(?i)`` becomes a scoped
    ``(?i:...)`` group, which both Python's ``re`` and RE2 accept inside an alternation."""
    return "|".join(f"(?i:{p[4:]})" if p.startswith("(?i)") else f"(?:{p})" for p in patterns)


_POSIX_CLASS = re.compile(r"\[:\^?[a-z]+:\]")


def signature_set(screens: list[str]) -> tuple[Any, list[int]] | None:
    """An RE2 set of the signatures' patterns: one linear pass names every signature a line matches, so a line
    the screen lets through is tried only against those (a watchdog timeout line matched about 60 patterns
    deep in the library: 0.67 ms a line one by one). The signatures RE2 cannot compile are returned apart,
    to be tried with ``re`` in their turn, as are those both engines compile but read apart. None without RE2 or
    when the set does not compile (its memory budget too small among others): then every signature is tried. A set
    that compiled cannot run out of memory in ``Match`` (RE2 keeps flushing a set's DFA cache rather than give up,
    and its compile ran the DFA once), which is as well, as the binding's ``Match`` reports no error."""
    try:
        import re2
    except ImportError:
        return None
    options = re2.Options()
    options.max_mem = SCREEN_MAX_MEM
    regex_set, index_of, python_only = re2.Set.SearchSet(options), [], []
    for i, pattern in enumerate(screens):
        # Python reads x{,5} as x{0,5}, RE2 as the literal text; [[:digit:]] or [x[:digit:]] is a POSIX class to
        # RE2 and the characters [, :, d, ... to Python: tried with ``re``
        if "{," in pattern or _POSIX_CLASS.search(pattern):
            python_only.append(i)
            continue
        try:
            re2.compile(pattern, options)
            regex_set.Add(pattern)
        except re2.error:
            python_only.append(i)
            continue
        index_of.append(i)
    try:
        regex_set.Compile()
    except re2.error:
        return None
    return (regex_set, index_of), python_only


class SignatureMatcher:
    """Finds the first signature a line matches.

    One combined regex (every pattern, its groups made non-capturing) screens each line; only the rare
    lines it hits are looked at further: an RE2 set names the signatures the line matches, and the first of
    them in priority order (or a signature RE2 cannot compile, tried with ``re`` in its turn) is the one;
    without RE2 the signatures are tried one by one. Python's ``re`` decides: RE2 screens the line or, for letters of
    another script, the line with them made one ASCII letter (``re2_screen_line``), and ``re`` tries the signatures it
    names on the line itself; a line the engines may read apart otherwise (a no-break space, a digit of another script)
    is screened by ``re`` and tried against every signature, where RE2 passed over a line ``re`` matches. A progress
    bar's blocks and a Chinese line keep RE2 (0.1-2 ms a line with ``re``).
    """

    def __init__(self, signatures: list[Signature] | None = None) -> None:
        self.signatures = signature_library() if signatures is None else signatures
        screens = [re.sub(r"\(\?P<\w+>", "(?:", s.pattern) for s in self.signatures]
        self._screen_pattern = any_of(sorted(screens, key=lambda s: s.startswith("(?i)")))
        self._screen = _screen(self._screen_pattern)
        built = signature_set(screens)
        self._set = None if built is None else built[0]
        self._python_only = [] if built is None else built[1]
        self._letters = proxies_letters(screens)

    @cached_property
    def _python_screen(self) -> re.Pattern[str]:
        """The screen with ``re``, for the lines RE2 may read otherwise (compiled at the first)."""
        return re.compile(self._screen_pattern)

    def _candidates(self, screened: str | None) -> list[Signature]:
        """The signatures to try on a line the screen let through, in priority order (every one when RE2 may not
        screen it: ``screened`` None)."""
        if self._set is None or screened is None:
            return self.signatures
        regex_set, index_of = self._set
        matched = [index_of[i] for i in regex_set.Match(screened) or ()]
        return [self.signatures[i] for i in sorted({*matched, *self._python_only})]

    def match(self, line: str) -> SignatureHit | None:
        if len(line) > MAX_MATCH_CHARS:
            line = line[: MAX_MATCH_CHARS // 2] + " " + line[-MAX_MATCH_CHARS // 2 :]
        screened = re2_screen_line(line, self._letters)
        if (self._python_screen.search(line) if screened is None else self._screen.search(screened)) is None:
            return None
        for signature in self._candidates(screened):
            found = signature.regex.search(line)
            if found is None:
                continue
            attrs = {k: v for k, v in found.groupdict().items() if v is not None}
            if signature.id in XID_SIGNATURES:
                return _xid_hit(signature, line, attrs)
            return SignatureHit(signature, signature.fault, signature.level, attrs)
        return None


def _xid_hit(signature: Signature, line: str, attrs: dict[str, Any]) -> SignatureHit:
    parsed = parse_xid_line(line)
    code = parsed.xid if parsed is not None else int(attrs["xid"])
    info = xid_info(code)
    attrs = {**attrs, "xid": code, "mnemonic": info.mnemonic, "action": info.action.value}
    if parsed is not None:
        attrs.update({"pci": parsed.pci_bus, "message": parsed.message})
        if parsed.pid is not None:
            attrs["pid"] = parsed.pid
    return SignatureHit(signature, info.fault, info.level, attrs)
