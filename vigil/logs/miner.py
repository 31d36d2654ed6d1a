"""Streaming log template miner: number-blind caches, masking, and token-position statistics for the rest.

How a block of lines finds its templates:

1. Cache by the line with every digit turned into 0 (``str.translate`` and a dict lookup per line, no
   regex): almost every line of a long log hits it.
2. For the misses, cache by the line with every number turned into a single 0.
3. Only lines never seen in that form are masked by :mod:`vigil.logs.masking` (values become ``<*>``),
   one representative per form, in one regex pass. A masked form that fits a known template (equal at
   every position where the template has a word) joins it.
4. The rest are grouped as Brain does (Yu et al., ICSE'23), with no similarity threshold: among the lines
   of one length (this block's new forms weighted by their line counts, plus the templates already known
   with theirs), each word is counted at its position. The words of a line that share the frequency most
   of its words have - the pattern it has in common with its siblings - are its constants, as are words
   more frequent than that; the positions below it are where the siblings differ. Such a position is a
   variable when the siblings hold more than ``max_split_values`` different words there, and otherwise
   splits them into separate templates (``opened`` / ``closed`` are two events, fifty user names are one
   variable). A word glued to a masked value names it (``do_page_fault+<*>``, ``uid=<*>``): siblings that hold
   a different such word at one position, each its own, are different events whatever their count. Words wrapped
   whole in the same brackets or quotes (``(sshd).``, ``[LNKD]``) are written as values:
   there more than ``max_slot_values`` different words suffice (``(reserved)`` / ``(usable)`` stay two events).
   Three more signs of a value need no count: a masked value at the same position of a sibling
   (``()`` beside ``(<*>)``), words that vary in more than one message (a user named in "session
   opened" and "session closed" is an entity, not an enumeration), and words the stream itself writes as the
   value of a ``key=value`` field (``user=uucp`` elsewhere makes ``for uucp`` a value; ``field_values``, kept
   per stream in a bounded set, not saved with the state). The grouped form joins a known
   template when no word of the two conflicts (the template is generalised where they differ), or starts
   a new one. A position found to hold values is found so for the whole template, not for one block: when a
   template's position opens, the templates split off earlier on a word there join it (:meth:`canonical`), so
   where blocks fall and how many lines came first no longer decide the grouping of the stream.
5. A form that still starts a new template is compared with the known templates of other lengths: when the two
   align word by word and what is left over on each side is nothing or one value (a masked value followed by
   masked values or short unit words: ``1190 bytes (1.16 KB)`` beside ``0 bytes``), the new template is a
   variant of the known one and its lines take that one's id. Before the first aligned word, a value on one side
   only must be masked values alone: a count that leads a statement (``1 more authentication failure`` beside
   ``authentication failure``) makes another one. ``max_split_values``, ``max_slot_values`` and
   ``max_unit_letters`` are chosen by leave-systems-out rotation on the Loghub samples (bench/logs.py).
6. The template's text shows, behind each ``<*>``, what its lines held there, in the conventions of the corrected
   Loghub ground truth (Khan et al., ICSE'22; :func:`render`): numbers are values even where they never varied, a
   word that only holds a digit and never varied is text (``jk2_init()``), so is the word before a number
   (``core.<*>``). Each new form's values are read once; grouping never looks at them.

Masking never looks at which digit a number has nor how many, which is what makes steps 1 and 2 exact.
Memory is bounded: each cache is cleared when it reaches ``max_cache`` keys (it is rebuilt from the
templates on demand) and at most ``max_templates`` templates are kept, the least recently learned one
being dropped first. The state saves to and loads from a JSON file, so mining survives a restart.
"""

from __future__ import annotations

import bz2
import codecs
import contextlib
import gzip
import io
import json
import logging
import lzma
import os
import re
import tempfile
import zlib
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from vigil.logs.masking import DATE, WILDCARD, mask, normalize_value, tidy, tokenize, values_of
from vigil.model import VigilInputError

STATE_VERSION = 2
# a word (no digit) written as the value of a key=value or key:value field: user=uucp, interactive=true
_FIELD_VALUE = re.compile(r"(?<=[\w.\-][=:])[A-Za-z_][A-Za-z_\-]*(?=[\s,;)\]}>]|$)", re.MULTILINE)
# a word wrapped whole in brackets or quotes, punctuation after it aside: "(sshd).", "[LNKD]", "'Active'"
_WRAPPED = re.compile(r"([(\[{<\"'])[^\s()\[\]{}<>\"']+([)\]}>\"'])[.,;:]?")
_DIGITS_TO_ZERO = str.maketrans("123456789", "000000000")
_HAS_DIGIT = re.compile(r"\d")


def _one_zero_per_number(digitless: str) -> str:
    """Shrink every run of 0s to one. Halving passes of C-level ``str.replace`` beat a regex here."""
    while "00" in digitless:
        digitless = digitless.replace("0000", "0").replace("00", "0")
    return digitless


def _fits(tokens: tuple[str, ...], pattern: tuple[str | None, ...]) -> bool:
    """Whether ``tokens`` hold every word of ``pattern`` (None: any token) at its place."""
    return all(word is None or word == token for word, token in zip(pattern, tokens, strict=True))


_MAX_VALUE_WORDS = 6  # at most this many more tokens in one variant than in the other


def _wrapped_alike(words: set[str]) -> bool:
    """Whether every word of ``words`` is wrapped whole in the same brackets or quotes (the slot of a value)."""
    frames = set()
    for word in words:
        found = _WRAPPED.fullmatch(word)
        if found is None:
            return False
        frames.add(found.group(1) + found.group(2))
    return len(frames) == 1


def _letters(token: str) -> int:
    return sum(map(str.isalpha, token))


def _is_value(tokens: list[str], max_letters: int) -> bool:
    """Whether a run of tokens reads as one value: a masked value first, then masked values or short words (units
    follow their number: ``<*> KB)``, ``<<*> sec``; ``(bus <*>)`` is text and a value). A ``key=`` field is not
    part of a value, nor is a token with no letter and no value (``****``)."""
    if WILDCARD not in tokens[0]:
        return False
    for token in tokens:
        if "=" in token:
            return False
        letters = _letters(token.replace(WILDCARD, ""))
        if letters > max_letters or (letters == 0 and WILDCARD not in token):
            return False
    return True


def _aligned_values(mine: list[str], my_open: set[int], theirs: list[str], their_open: set[int],
                    max_letters: int) -> int:
    """How many tokens two forms of different lengths align on when every stretch between aligned tokens is,
    on each side, empty or one value (see :func:`_is_value`); 0 when some stretch is not."""
    n, m = len(mine), len(theirs)

    def score(i: int, j: int) -> int:
        return 2 if mine[i] == theirs[j] else 1 if i in my_open or j in their_open else 0

    # longest common subsequence, open positions matching anything (an equal token counts double, so that
    # words align with words before open positions swallow them)
    table = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(n - 1, -1, -1):
        row, below = table[i], table[i + 1]
        for j in range(m - 1, -1, -1):
            gain = score(i, j)
            row[j] = max(below[j + 1] + gain, below[j], row[j + 1]) if gain else max(below[j], row[j + 1])
    i = j = 0
    gap_mine: list[str] = []
    gap_theirs: list[str] = []
    aligned = 0
    while i < n or j < m:
        if i < n and j < m and score(i, j) and table[i][j] == table[i + 1][j + 1] + score(i, j):
            if gap_mine or gap_theirs:
                if not ((not gap_mine or _is_value(gap_mine, max_letters))
                        and (not gap_theirs or _is_value(gap_theirs, max_letters))):
                    return 0
                # a count before the whole statement on one side only ("1 more failure" beside "failure")
                # qualifies the statement: there the value is a value with no word beside it
                if not aligned and not (gap_mine and gap_theirs) and not _is_value(gap_mine or gap_theirs, 0):
                    return 0
                gap_mine, gap_theirs = [], []
            aligned += 1
            i += 1
            j += 1
        elif j < m and (i == n or table[i][j + 1] >= table[i + 1][j]):
            gap_theirs.append(WILDCARD if j in their_open else theirs[j])
            j += 1
        else:
            gap_mine.append(WILDCARD if i in my_open else mine[i])
            i += 1
    if (gap_mine or gap_theirs) and not ((not gap_mine or _is_value(gap_mine, max_letters))
                                         and (not gap_theirs or _is_value(gap_theirs, max_letters))):
        return 0
    return aligned if aligned * 2 >= max(n, m) else 0


# a word holding both a digit and a letter (jk2_init, ee0): text while it never varies, so checked on every line
_MIXED = re.compile(r"[A-Za-z0-9_]*(?:[A-Za-z_][0-9]|[0-9][A-Za-z_])[A-Za-z0-9_]*")
_LETTER = re.compile(r"[A-Za-z]")


_QUIET = 8
# one word and its number (core.<*>, node-<*>, CPU#<*>), punctuation around them aside
_WORD_NUMBER = re.compile(r"[^\w\s]*(?:[A-Za-z_]\w*[^\w\s<*>]*)?<\*>[^\w\s]*")
_LONG_NUMBER = re.compile(r"\d{4}")
# a word, a sign and its masked value (do_page_fault+<*>, uid=<*>): the word names what the value is
_NAMED_VALUE = re.compile(r"[^\w\s<*>]*([A-Za-z_]\w*)[^\w\s<*>]+<\*>[^\w\s]*")
_FRAME = re.compile(r"[^\w\s<*>]*")  # punctuation only (no word, space or value)


class Seen:
    """What the lines of a template held as one word of one value: the first word, and once they differed the text
    all of them held before and after the difference (never overlapping in the shortest word)."""

    __slots__ = ("first", "prefix", "suffix", "varied", "shortest")

    def __init__(self, first: str, prefix: str | None = None, suffix: str | None = None, varied: bool = False,
                 shortest: int | None = None) -> None:
        self.first = first
        self.prefix = first if prefix is None else prefix
        self.suffix = first if suffix is None else suffix
        self.varied = varied
        self.shortest = len(first) if shortest is None else shortest

    def see(self, word: str) -> bool:
        """Take one more word in; whether anything changed."""
        if not self.varied:
            if word == self.first:
                return False
        elif word.startswith(self.prefix) and word.endswith(self.suffix) and len(word) >= len(self.prefix) + len(
                self.suffix):
            return False
        self.prefix = os.path.commonprefix([self.prefix, word])
        self.suffix = os.path.commonprefix([self.suffix[::-1], word[::-1]])[::-1]
        self.shortest = min(self.shortest, len(word))
        if len(self.prefix) + len(self.suffix) > self.shortest:
            self.suffix = self.suffix[len(self.prefix) + len(self.suffix) - self.shortest:]
        self.varied = True
        return True

    def state(self) -> list[str | bool | int]:
        return [self.first, self.prefix, self.suffix, self.varied, self.shortest]


def _show(word: Seen) -> str:
    """One word of a value. Where the lines held different words: ``<*>``, with the punctuation all of them had
    before and after it (``(<*>)``). Where they all held the same: that word when it holds no number, or a number
    inside a word (``jk2_init``, ``ee0``); one value when it is a quantity (it starts with a number: ``599k``), an
    id (a run of four digits or more), more than one number (``msra-sa-41:8030``, ``10.0.0.1:8030``) or more than
    one word beside its number (``gw.example.org:8080``); else the word with its number as a value (``core.<*>``,
    ``node-<*>``)."""
    if word.varied:
        prefix, suffix = word.prefix, word.suffix
        return (prefix if _FRAME.fullmatch(prefix) else "") + WILDCARD + (suffix if _FRAME.fullmatch(suffix) else "")
    shown = word.first
    digits = any(c.isdigit() for c in shown)
    if WILDCARD not in shown and not digits:
        return shown
    if shown.count(WILDCARD) > 1 or (WILDCARD in shown and not _WORD_NUMBER.fullmatch(shown)):
        return WILDCARD
    if digits and (WILDCARD in shown or _LONG_NUMBER.search(shown) or shown[0].isdigit()):
        return WILDCARD
    return shown


def _render_value(words: list[Seen] | None) -> str:
    """What one ``<*>`` reads as: word by word (see :func:`_show`) where each word of the value varied or is a value
    by itself, punctuation aside (``<*> <*>``: two numbers, a path and an id); else, as for a date, one ``<*>``."""
    if not words:
        return WILDCARD
    if len(words) > 1 and not all(word.varied or _FRAME.fullmatch(word.first.replace(WILDCARD, "")) for word in words):
        return WILDCARD
    return " ".join(_show(word) for word in words)


Values = dict[tuple[int, int], list[Seen] | None]


def render_token(token: str, position: int, values: Values) -> str:
    if WILDCARD not in token:
        return token
    parts = token.split(WILDCARD)
    return parts[0] + "".join(_render_value(values.get((position, k))) + part for k, part in enumerate(parts[1:]))


def render(tokens: list[str], values: Values) -> str:
    """A template's text: its words, each ``<*>`` as its lines showed it (see :func:`_render_value`), in the
    conventions' form (:func:`vigil.logs.masking.tidy`)."""
    return tidy(" ".join(render_token(token, p, values) for p, token in enumerate(tokens)))


@dataclass
class Template:
    """One mined template: ``tokens`` with ``<*>`` at the variable positions. ``open`` are the positions where
    the template's lines hold different words (they take any token); the other ``<*>`` are masked values, which
    only a masked value matches - a word there is another event."""

    id: str
    tokens: list[str]
    size: int = 0
    last_seen: int = 0
    open: set[int] = field(default_factory=set)
    same_as: str | None = None  # the template of another length this one is a variant of (a value of more words)
    long_words: frozenset[str] | None = field(default=None, repr=False, compare=False)  # see TemplateMiner._long
    # what the lines held behind each <*>: (position, n-th <*> of the token) -> what they held as each word of the
    # value, or None when the values had different word counts (see render)
    values: Values = field(default_factory=dict, repr=False, compare=False)
    pins: tuple[str, ...] = field(default=(), repr=False, compare=False)  # words with a digit not yet seen to vary
    _text: str | None = field(default=None, repr=False, compare=False)
    _settled: bool = field(default=False, repr=False, compare=False)
    _quiet: int = field(default=0, repr=False, compare=False)  # lines observed since the text last changed

    @property
    def text(self) -> str:
        if self._text is None:
            self._text = render(self.tokens, self.values)
        return self._text

    def observe(self, form: list[str], values: list[str]) -> None:
        """Learn what one line of this template held behind each ``<*>`` (``form``: its masked tokens, ``values``: the
        raw text of each of their ``<*>``, :func:`vigil.logs.masking.values_of`)."""
        if len(form) != len(self.tokens):
            return
        changed = False
        k = 0
        for p, (mine, theirs) in enumerate(zip(self.tokens, form, strict=True)):
            n = theirs.count(WILDCARD)
            if WILDCARD in mine:
                if mine == WILDCARD:  # the whole token, as the line wrote it
                    raw = theirs
                    for value in values[k:k + n]:
                        raw = raw.replace(WILDCARD, value, 1)
                    changed |= self._see((p, 0), raw)
                elif mine == theirs:
                    for j in range(n):
                        changed |= self._see((p, j), values[k + j])
            k += n
        if changed:
            self._text = None
            self._quiet = 0
            self.repin()
        else:
            self._quiet += 1

    def repin(self) -> None:
        self.pins = tuple(sorted({pin for words in self.values.values() if words for word in words
                                  if not word.varied for pin in _MIXED.findall(word.first)}))

    @property
    def settled(self) -> bool:
        """Whether lines need no longer be observed: each value varied with nothing kept around it, or the last
        ``_QUIET`` lines observed changed nothing."""
        if self._settled or self._quiet >= _QUIET:
            return True
        self._settled = (
            sum(token.count(WILDCARD) for token in self.tokens) == len(self.values)
            and all(words is None or all(word.varied and not word.prefix and not word.suffix for word in words)
                    for words in self.values.values()))
        return self._settled

    def _see(self, key: tuple[int, int], value: str) -> bool:
        words = normalize_value(value).split()
        if len(words) > 1 and DATE.fullmatch(value):
            words = [" ".join(words)]  # a date is one value
        if key not in self.values:
            self.values[key] = [Seen(w) for w in words]
            return True
        known = self.values[key]
        if known is None:
            return False
        if len(known) != len(words):
            self.values[key] = None
            return True
        changed = False
        for word, seen in zip(words, known, strict=True):
            changed |= seen.see(word)
        return changed

    def forget(self, position: int) -> None:
        """``position`` became open: it starts over from what its token read until now."""
        before = render_token(self.tokens[position], position, self.values)
        for key in [k for k in self.values if k[0] == position]:
            del self.values[key]
        self.values[(position, 0)] = [Seen(w) for w in before.split()] or None
        self._text = None


@dataclass(frozen=True)
class Match:
    template_id: str
    template: str


@dataclass
class TemplateMiner:
    """Mines templates from a stream of log lines; ``add`` / ``add_block`` return one match per line."""

    max_split_values: int = 10
    max_unit_letters: int = 4
    field_values: bool = True
    max_slot_values: int = 2
    max_templates: int = 50_000
    max_cache: int = 200_000
    templates: dict[str, Template] = field(default_factory=dict)
    _cache: dict[str, Template] = field(default_factory=dict, repr=False)
    _digit_cache: dict[str, Template] = field(default_factory=dict, repr=False)
    _width_cache: dict[str, Template] = field(default_factory=dict, repr=False)
    _by_length: dict[int, list[Template]] = field(default_factory=dict, repr=False)
    _next_id: int = 1
    _clock: int = 0
    _variants: int = 0
    _values: set[str] = field(default_factory=set, repr=False)

    # ------------------------------------------------------------------ matching

    def add(self, line: str) -> Match:
        """Learn from one line and return its template."""
        template = self.add_templates([line])[0]
        return Match(template.id, template.text)

    def add_block(self, lines: list[str]) -> list[Match]:
        """Learn from many lines at once and return one match per line."""
        return [Match(t.id, t.text) for t in self.add_templates(lines)]

    def add_templates(self, lines: list[str]) -> list[Template]:
        """Learn from many lines and return the live :class:`Template` of each (the fast path).

        No masking rule looks at which digit a number has, nor at how many, so lines that differ only
        in their numbers mask alike. The first lookup is by the line with every digit turned into 0 (a
        C-level ``translate`` and a dict lookup, no regex); the second, for the lines that miss, by the
        line with every number turned into a single 0; only lines never seen in that form are masked,
        one representative per form, all in one regex pass.
        """
        if not lines:
            return []
        flat = [line.replace("\n", " ") if "\n" in line else line for line in lines]
        digitless = "\n".join(flat).translate(_DIGITS_TO_ZERO).split("\n")
        found: list[Template | None] = list(map(self._digit_cache.get, digitless))
        self._clock += len(lines)
        missing = [i for i, template in enumerate(found) if template is None]
        if missing:
            self._resolve(flat, digitless, found, missing)
        for template in found:  # line counts: the statistics the grouping of later forms weighs
            template.size += 1  # type: ignore[union-attr]
        # one line of each template per block (the last) checks its pins
        for template, line in dict(zip(map(id, found), zip(found, flat, strict=True), strict=True)).values():
            if template.pins:  # type: ignore[union-attr]
                self._check_pins(template, line)  # type: ignore[arg-type]
        if self._variants:
            return [self.canonical(t) for t in found]  # type: ignore[arg-type]
        return found  # type: ignore[return-value]

    @staticmethod
    def _check_pins(template: Template, line: str) -> None:
        """A word with a digit the template's lines held so far (``jk2_init``) is text until a line holds another:
        lines that differ only in their digits share a cache entry, so each is checked here (a substring test)."""
        for pin in template.pins:
            if pin not in line:
                values = values_of(line)
                if values is not None:
                    template.observe(tokenize(mask(line)), values)
                if pin in template.pins:  # the line did not show where: stop checking that word
                    template.pins = tuple(p for p in template.pins if p != pin)
                return

    def canonical(self, template: Template) -> Template:
        """The template ``template``'s lines belong to now: the one a variant of another length stands for, or the
        one a template split off on a word was joined into once that word's position was found to hold values
        (itself when that one was evicted)."""
        if template.same_as is None:
            return template
        for _ in range(len(self.templates)):  # a chain is at most as long as the table; evicted links end it
            if template.same_as is None:
                return template
            joined = self.templates.get(template.same_as)
            if joined is None or joined is template:
                return template
            template = joined
        return template

    def _resolve(self, flat: list[str], digitless: list[str], found: list[Template | None],
                 missing: list[int]) -> None:
        # Bulk dict and list operations throughout: a cold block misses on every line.
        missing_digitless = [digitless[i] for i in missing]
        widthless = _one_zero_per_number("\n".join(missing_digitless)).split("\n")
        resolved = list(map(self._width_cache.get, widthless))
        if None in resolved:
            first_of = dict(zip(reversed(widthless), range(len(widthless) - 1, -1, -1), strict=True))
            unseen = sorted(((key, j) for key, j in first_of.items() if key not in self._width_cache),
                            key=lambda item: item[1])  # learn in line order
            text = "\n".join(flat[missing[j]] for _, j in unseen)
            if self.field_values:
                self._remember_values(_FIELD_VALUE.findall(text))
            masked = mask(text).split("\n")
            lines_of = Counter(widthless)
            fresh = self._learn_forms(masked, [lines_of[width_key] for width_key, _ in unseen],
                                      [flat[missing[j]] for _, j in unseen])
            learned: dict[str, Template] = {}
            for (width_key, _), key, template in zip(unseen, masked, fresh, strict=True):
                if not _HAS_DIGIT.search(key):  # else a digit survived: the number-free form is not a safe key
                    learned[width_key] = template
            self._remember_all(self._width_cache, learned)
            resolved = [t if t is not None else learned.get(k) for t, k in zip(resolved, widthless, strict=True)]
            for j, known in enumerate(resolved):
                if known is None:  # rare: lines whose masked form keeps a digit
                    resolved[j] = self._learn_forms([mask(flat[missing[j]])], [1], [flat[missing[j]]])[0]
        safe = {k: t for k, t, w in zip(missing_digitless, resolved, widthless, strict=True) if w in self._width_cache}
        self._remember_all(self._digit_cache, safe)  # type: ignore[arg-type]
        for i, known in zip(missing, resolved, strict=True):
            found[i] = known

    def _remember_all(self, cache: dict[str, Template], entries: dict[str, Template]) -> None:
        if len(cache) + len(entries) > self.max_cache:
            cache.clear()  # rebuilt from the templates on demand; clearing keeps memory bounded
        if len(entries) <= self.max_cache:
            cache.update(entries)

    def _remember_values(self, values: list[str]) -> None:
        if len(self._values) + len(values) > self.max_cache:
            self._values.clear()  # bounded like the caches; the values seen since are kept
        self._values.update(values)

    def _remember(self, cache: dict[str, Template], key: str, template: Template) -> None:
        if len(cache) >= self.max_cache:
            cache.clear()  # rebuilt from the templates on demand; clearing keeps memory bounded
        cache[key] = template

    def match(self, line: str) -> Match | None:
        """The template a line belongs to, without learning anything."""
        key = mask(line.replace("\n", " "))
        template = self._cache.get(key) or self._fitting(tokenize(key) or [""])
        if template is None:
            return None
        template = self.canonical(template)
        return Match(template.id, template.text)

    def _learn_forms(self, keys: list[str], lines: list[int], raws: list[str]) -> list[Template]:
        """The template of each masked form (``lines``: how many lines of this block have it; ``raws``: one line
        of each, whose values the template learns how to show)."""
        found: list[Template | None] = []
        new: list[int] = []
        for i, key in enumerate(keys):
            known = self._cache.get(key) or self._fitting(tokenize(key) or [""])
            found.append(known)
            if known is None:
                new.append(i)
        if new:
            grouped = self._group([tokenize(keys[i]) or [""] for i in new], [lines[i] for i in new])
            for i, (tokens, open_positions) in zip(new, grouped, strict=True):
                found[i] = self._absorb(tokens, open_positions)
        for key, raw, template in zip(keys, raws, found, strict=True):
            template.last_seen = self._clock  # type: ignore[union-attr]
            self._remember(self._cache, key, template)  # type: ignore[arg-type]
            if template.same_as is None and not template.settled:  # type: ignore[union-attr]
                values = values_of(raw)
                if values is not None and len(values) == key.count(WILDCARD):
                    template.observe(tokenize(key), values)  # type: ignore[union-attr]
        return found  # type: ignore[return-value]

    def _fitting(self, tokens: list[str]) -> Template | None:
        """The template whose every word is at its place in ``tokens`` (the most specific one)."""
        best: Template | None = None
        best_words = -1
        for template in self._by_length.get(len(tokens), ()):
            words = 0
            for position, (mine, theirs) in enumerate(zip(template.tokens, tokens, strict=True)):
                if position in template.open:
                    continue
                if mine != theirs:
                    break
                words += mine != WILDCARD
            else:
                if words > best_words:
                    best, best_words = template, words
        return best

    def _group(self, forms: list[list[str]], lines: list[int]) -> list[tuple[list[str], set[int]]]:
        """Each new form with ``<*>`` at the positions where its siblings vary, and those positions (see the
        module docstring)."""
        grouped: list[tuple[list[str], set[int]]] = [([], set()) for _ in forms]
        by_length: dict[int, list[int]] = defaultdict(list)
        for i, tokens in enumerate(forms):
            by_length[len(tokens)].append(i)
        families: list[tuple[list[int], list[tuple[str, ...]], dict[tuple[str | None, ...], list[int]]]] = []
        for length, members in by_length.items():
            known = [tuple(WILDCARD if p in t.open else w for p, w in enumerate(t.tokens))
                     for t in self._by_length.get(length, ())]
            weights = [max(t.size, 1) for t in self._by_length.get(length, ())]
            counts = [Counter[str]() for _ in range(length)]
            weighted: list[tuple[tuple[str, ...], int]] = [(tuple(forms[i]), lines[i]) for i in members]
            for words, weight in weighted + list(zip(known, weights, strict=True)):
                for position, token in enumerate(words):
                    counts[position][token] += weight
            patterns: dict[tuple[str | None, ...], list[int]] = defaultdict(list)
            for i in members:
                # masked values are no words: they take no part in the pattern, and stay variables
                frequency = [0 if token == WILDCARD else counts[p][token] for p, token in enumerate(forms[i])]
                shared = Counter(f for f in frequency if f)
                common = max(shared, key=lambda f: (shared[f], f)) if shared else 0
                pattern = tuple(token if f >= common else None for token, f in zip(forms[i], frequency, strict=True))
                patterns[pattern].append(i)
            families.append((members, known, patterns))
        # A word that varies in more than one pattern names an entity (a user, a host) that recurs in different
        # messages: a value. A word set that only one message varies over is more likely an enumeration.
        patterns_of: dict[str, set[tuple[str | None, ...]]] = defaultdict(set)
        for _, _, patterns in families:
            for pattern, siblings in patterns.items():
                for p, word in enumerate(pattern):
                    if word is None:
                        for i in siblings:
                            patterns_of[forms[i][p]].add(pattern)
        for _, known, patterns in families:
            for pattern, siblings in patterns.items():
                variable = set()
                fitting = [t for t in known if _fits(t, pattern)]
                for p in (p for p, word in enumerate(pattern) if word is None):
                    values = {forms[i][p] for i in siblings}
                    values.update(t[p] for t in fitting)
                    # each a different word glued to its masked value (do_page_fault+<*> / schedule+<*>, uid=<*> /
                    # pid=<*>): the words name what the values are, text in every line - another word, another event
                    names = [_NAMED_VALUE.fullmatch(value) for value in values]
                    if all(names) and len({found.group(1) for found in names if found}) == len(values):
                        continue
                    roaming = sum(len(patterns_of[value]) > 1 for value in values if WILDCARD not in value)
                    # words the stream writes as the value of a key=value field elsewhere (user=uucp) are values
                    roaming += sum(value in self._values for value in values) if self._values else 0
                    # a masked value at one position (alone or in a word: "(<*>)") and words at another
                    # line's same position: the position holds values
                    # words wrapped whole in brackets or quotes (a process name "(sshd)", a link "[LNKD]") are
                    # written as values: a few of them there suffice ("(reserved)" / "(usable)" stay two events)
                    limit = self.max_split_values
                    if len(values) > self.max_slot_values and _wrapped_alike(values):
                        limit = min(limit, self.max_slot_values)
                    if (len(values) > limit or roaming > 1
                            or (len(values) > 1 and any(WILDCARD in value for value in values))):
                        variable.add(p)
                for i in siblings:
                    grouped[i] = ([WILDCARD if p in variable else token for p, token in enumerate(forms[i])],
                                  variable)
        return grouped

    def _absorb(self, tokens: list[str], open_positions: set[int]) -> Template:
        """The known template with which ``tokens`` conflict nowhere but at open positions (of either), made
        open where they differ; or a new template."""
        best: Template | None = None
        best_words = -1
        for template in self._by_length.get(len(tokens), ()):
            words = 0
            for position, (mine, theirs) in enumerate(zip(template.tokens, tokens, strict=True)):
                if position in template.open or position in open_positions:
                    continue
                if mine != theirs:
                    break
                words += mine != WILDCARD
            else:
                if words > best_words:
                    best, best_words = template, words
        if best is None:
            variant_of = self._variant_of(tokens, open_positions) if self.max_unit_letters >= 0 else None
            template = self._create(tokens)
            template.open = set(open_positions)
            if variant_of is not None:
                template.same_as = variant_of.id
                self._variants += 1
            return template
        opened = len(best.open)
        self._generalize(best, tokens)
        best.open |= open_positions
        best._text = None
        best._settled = False
        best._quiet = 0
        best.long_words = None
        if len(best.open) > opened:
            self._join_split_off(best)
        return best

    def _join_split_off(self, template: Template) -> None:
        """Join into ``template`` the templates of its length that equal it but at its open positions: they were
        split off on a word there while that position looked like an enumeration (few words in the lines seen so
        far, or in a block), and the evidence that it holds values now stands for all of them. Which lines and
        blocks came first then no longer decides the grouping; lines read before keep the id they were given."""
        target = self.canonical(template)
        pattern = tuple(None if p in template.open else token for p, token in enumerate(template.tokens))
        for sibling in self._by_length.get(len(template.tokens), ()):
            if (sibling is template or sibling.same_as is not None or not sibling.open <= template.open
                    or not _fits(tuple(sibling.tokens), pattern) or self.canonical(sibling) is target):
                continue
            sibling.same_as = target.id
            self._variants += 1

    def _variant_of(self, tokens: list[str], open_positions: set[int]) -> Template | None:
        """A known template of another length that ``tokens`` equal but for values of a different number of words.

        The two are aligned word by word (an open position takes any token); what is left between the aligned
        words must, on each side, be nothing or one value: masked values with at most short words beside them
        (units, brackets: ``1190 bytes (1.16 KB)`` beside ``0 bytes``, ``<1 sec`` beside ``00:02``). A word longer
        than ``max_unit_letters`` letters left over is text, and the two are different statements.
        """
        size = len(tokens)
        mine = self._long_words(tokens, open_positions)
        best: Template | None = None
        best_aligned = 0
        for length in range(max(1, size - _MAX_VALUE_WORDS), size + _MAX_VALUE_WORDS + 1):
            if length == size:
                continue
            for template in self._by_length.get(length, ()):
                # quick screen: more long words on one side only than open positions on the other to take them
                if template.long_words is None:
                    template.long_words = self._long_words(template.tokens, template.open)
                theirs = template.long_words
                if len(mine - theirs) > len(template.open) or len(theirs - mine) > len(open_positions):
                    continue
                aligned = _aligned_values(tokens, open_positions, template.tokens, template.open,
                                          self.max_unit_letters)
                if aligned > best_aligned:
                    best, best_aligned = template, aligned
        return None if best is None else self.canonical(best)

    def _long_words(self, tokens: list[str], open_positions: set[int]) -> frozenset[str]:
        """The words of a form too long to stand beside a value (see :meth:`_variant_of`), a word glued to a masked
        value among them (``do_page_fault+<*>``: no stretch left over may hold it, see :func:`_is_value`)."""
        return frozenset(t for p, t in enumerate(tokens)
                         if p not in open_positions and _letters(t) > self.max_unit_letters)

    def _create(self, tokens: list[str]) -> Template:
        if len(self.templates) >= self.max_templates:
            self._evict()
        template = Template(id=f"t{self._next_id}", tokens=list(tokens))
        self._next_id += 1
        self.templates[template.id] = template
        self._by_length.setdefault(len(tokens), []).append(template)
        return template

    def _generalize(self, template: Template, tokens: list[str]) -> None:
        template.long_words = None
        template._text = None
        template._settled = False
        template._quiet = 0
        for i, token in enumerate(tokens):
            if template.tokens[i] != token or i in template.open:
                if template.tokens[i] != WILDCARD:
                    template.forget(i)
                template.tokens[i] = WILDCARD
                template.open.add(i)

    def _evict(self) -> None:
        oldest = min(self.templates.values(), key=lambda t: t.last_seen)
        del self.templates[oldest.id]
        bucket = self._by_length.get(len(oldest.tokens), [])
        if oldest in bucket:
            bucket.remove(oldest)
        self._cache = {k: v for k, v in self._cache.items() if v is not oldest}
        self._digit_cache = {k: v for k, v in self._digit_cache.items() if v is not oldest}
        self._width_cache = {k: v for k, v in self._width_cache.items() if v is not oldest}

    # ------------------------------------------------------------------ persistence

    def save(self, path: Path) -> None:
        """Write the templates atomically (a crash mid-write leaves the previous file intact)."""
        state = {
            "version": STATE_VERSION,
            "max_split_values": self.max_split_values,
            "max_unit_letters": self.max_unit_letters,
            "field_values": self.field_values,
            "max_slot_values": self.max_slot_values,
            "next_id": self._next_id,
            "clock": self._clock,
            "templates": [
                {"id": t.id, "tokens": t.tokens, "size": t.size, "last_seen": t.last_seen, "open": sorted(t.open),
                 **({"same_as": t.same_as} if t.same_as is not None else {}),
                 **({"values": [[p, k, None if words is None else [w.state() for w in words]]
                                for (p, k), words in t.values.items()]} if t.values else {})}
                for t in self.templates.values()
            ],
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(state, out)
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path, **params: float | int) -> TemplateMiner:
        """A miner restored from :meth:`save`; a missing file gives a fresh miner."""
        if not path.exists():
            return cls(**params)  # type: ignore[arg-type]
        if not path.is_file():
            raise VigilInputError(f"template state {path} is not a file")
        try:
            state = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(state, dict):
                raise TypeError("expected a JSON object at the top level")
            if state.get("version") not in (1, STATE_VERSION):
                raise VigilInputError(
                    f"template state {path}: version {state.get('version')!r}, expected {STATE_VERSION}"
                )
            # version 1 held a similarity threshold; its templates load the same
            params.setdefault("max_split_values", int(state.get("max_split_values", cls.max_split_values)))
            params.setdefault("max_unit_letters", int(state.get("max_unit_letters", cls.max_unit_letters)))
            params.setdefault("field_values", bool(state.get("field_values", cls.field_values)))
            params.setdefault("max_slot_values", int(state.get("max_slot_values", cls.max_slot_values)))
            miner = cls(**params)  # type: ignore[arg-type]
            for item in state["templates"]:
                tokens = [str(tok) for tok in item["tokens"]]
                # a version-1 template's <*> all came from merging lines: open
                open_positions = (item["open"] if "open" in item
                                  else [p for p, token in enumerate(tokens) if token == WILDCARD])
                template = Template(str(item["id"]), tokens, int(item["size"]), int(item["last_seen"]),
                                    {int(p) for p in open_positions},
                                    str(item["same_as"]) if item.get("same_as") is not None else None)
                for p, k, words in item.get("values", ()):
                    template.values[(int(p), int(k))] = (
                        None if words is None else [Seen(str(w[0]), str(w[1]), str(w[2]), bool(w[3]), int(w[4]))
                                                    for w in words])
                template.repin()
                miner._variants += template.same_as is not None
                miner.templates[template.id] = template
                miner._by_length.setdefault(len(tokens), []).append(template)
            miner._next_id = int(state["next_id"])
            miner._clock = int(state["clock"])
        except (ValueError, KeyError, TypeError) as err:
            raise VigilInputError(f"template state {path} is not a valid miner state: {err}") from None
        return miner


def read_lines(path: Path, block_size: int = 4096, limit: int | None = None) -> Iterator[list[str]]:
    """Lines of a file in blocks, decoded leniently: invalid UTF-8 and NUL bytes never stop a parse, and a UTF-8 byte
    order mark at its start is dropped.

    Lines longer than 64 KiB are cut (the rest is still read and dropped) so one giant line cannot
    blow up memory or the template table. A run of NUL bytes at the file's start is skipped: logrotate's
    ``copytruncate`` empties a file its writer keeps open, and a writer without ``O_APPEND`` goes on at its old offset,
    leaving a hole of zeros before its next line (read as one over-long line, it swallowed that line). ``limit``: the
    most inflated bytes a compressed file is read to (default :data:`MAX_INFLATED_BYTES`).
    """
    handle = _open_log(path, limit)
    with handle:
        _skip_hole(handle)
        if handle.peek(3)[:3] == codecs.BOM_UTF8:  # a Windows tool's byte order mark is no part of the first line
            handle.read(3)
        block: list[str] = []
        for raw in _bounded_lines(handle):
            block.append(raw.decode("utf-8", errors="replace").replace("\x00", " ").rstrip("\r\n"))
            if len(block) >= block_size:
                yield block
                block = []
        if block:
            yield block


# A rotated generation compressed by logrotate (compresscmd gzip by default; bzip2 or xz when configured): read through
# the codecs of Python's standard library. zstd (Python 3.14's compression.zstd) is not among them: a .zst file is not
# read. A compressed file is read up to MAX_INFLATED_BYTES once inflated (a decompression bomb: a few KiB of gzip that
# inflate to terabytes); what lies beyond, and a generation cut short or corrupt, is left out with a warning.
COMPRESSED = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open, ".lzma": lzma.open}
MAX_INFLATED_BYTES = 4 << 30
# The total a triage inflates across all compressed files it reads (vigil logs triage --inflate-budget): a directory of
# many compressed generations, each under the cap, still ends. 16 GiB: four files at the cap.
INFLATE_BUDGET_BYTES = 16 << 30
_log = logging.getLogger(__name__)


class InflateBudgetPassed(Exception):  # noqa: N818 - a signal to read again under a plan, not a failure
    """Raised by a compressed file's read once the bytes inflated across one triage pass its budget (see
    :func:`count_inflated`): the triage is read again under :func:`inflation_plan`."""


# The bytes inflated so far in one triage (a multiprocessing Value shared with its reading processes) and its budget;
# None: not counted.
_inflated_total: Any = None
_inflated_budget = 0


def count_inflated(total: Any, budget: int) -> None:
    """Count every compressed file's inflated bytes into ``total`` (a ``multiprocessing.Value("q")``, or None to stop
    counting); a read that takes it past ``budget`` raises :class:`InflateBudgetPassed`."""
    global _inflated_total, _inflated_budget  # noqa: PLW0603 - one triage's counter in this process
    _inflated_total, _inflated_budget = total, budget


def _open_log(path: Path, limit: int | None = None) -> io.BufferedReader:
    opener = COMPRESSED.get(path.suffix.lower())
    try:
        if opener is None:
            return path.open("rb")
        return io.BufferedReader(_Inflated(opener(path, "rb"), path,  # type: ignore[operator]
                                           MAX_INFLATED_BYTES if limit is None else limit))
    except OSError as err:
        raise VigilInputError(f"cannot read log file {path}: {err.strerror or err}") from None


class _Inflated(io.RawIOBase):
    """A compressed file's inflated bytes up to ``limit``; a corrupt or truncated stream ends where it can no longer be
    read."""

    def __init__(self, stream: BinaryIO, path: Path, limit: int) -> None:
        self._stream, self._path, self._left, self._limit = stream, path, limit, limit

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._left <= 0:
            return 0
        view = memoryview(buffer).cast("B")
        data = b""
        try:
            data = self._stream.read(min(len(view), self._left))
            self._left -= len(data)
            _count(len(data))
            # the look past the cap may find the stream cut short too: what was read is kept
            if self._left <= 0 and self._stream.read(1):
                _log.warning("log file %s inflates past %d bytes: the rest is not read", self._path, self._limit)
        except (EOFError, OSError, lzma.LZMAError, zlib.error) as err:
            _log.warning("log file %s is corrupt or cut short (%s): read up to there", self._path, err)
            self._left = 0
        view[:len(data)] = data
        return len(data)

    def close(self) -> None:
        self._stream.close()
        super().close()


def _count(size: int) -> None:
    total = _inflated_total
    if total is None or not size:
        return
    with total.get_lock():
        total.value += size
        passed = total.value > _inflated_budget
    if passed:
        raise InflateBudgetPassed


def _skip_hole(handle: io.BufferedReader) -> None:
    """Past the zeros a writer left at a copytruncated file's start (a sparse hole: ``SEEK_DATA`` skips most of it)."""
    if handle.peek(1)[:1] != b"\0":
        return
    raw = handle.raw
    if isinstance(raw, io.FileIO) and hasattr(os, "SEEK_DATA"):
        # no data at all (ENXIO), or a file system without SEEK_DATA: read through the zeros
        with contextlib.suppress(OSError):
            handle.seek(os.lseek(raw.fileno(), 0, os.SEEK_DATA))
    while True:
        chunk = handle.peek(65536)
        if not chunk:
            return
        kept = len(chunk) - len(chunk.lstrip(b"\0"))
        handle.read(kept)
        if kept < len(chunk):
            return


def inflation_plan(files: list[list[Path]], budget: int | None,
                   root: Path | None = None) -> tuple[dict[Path, int], str]:
    """How far each compressed file of one triage is inflated under a total ``budget`` of inflated bytes (``None``:
    no total, each file still capped at :data:`MAX_INFLATED_BYTES`). ``files``: each log's files oldest first (its
    rotated generations). The newest generations are served first - every log's newest compressed file, then each
    one's next older, and so on - so what a budget leaves out is the oldest history. Returns the limit of every file
    read short (0: not read) and a line naming them (relative to ``root``) for a warning ('' when nothing is left out).

    A file's inflated size is only known by inflating it, so when the budget could be reached (each file's bound - the
    cap, or for gzip 1,032 times its size, deflate's largest ratio - summed past it) the compressed files are inflated
    once here to count, newest first, up to what is left of the budget."""
    by_age = [[path for path in reversed(stream) if path.suffix.lower() in COMPRESSED] for stream in files]
    ordered = [stream[age] for age in range(max((len(s) for s in by_age), default=0)) for stream in by_age
               if age < len(stream)]
    if budget is None or not ordered:
        return {}, ""
    if not inflation_could_pass(files, budget):
        return {}, ""
    limits: dict[Path, int] = {}
    left = budget
    for path in ordered:
        cap = min(MAX_INFLATED_BYTES, left)
        size = _inflated_size(path, cap) if cap > 0 else 1
        if size >= cap and cap < MAX_INFLATED_BYTES:
            limits[path] = cap  # read up to what is left (0: not read); past the cap itself it warns on its own
        left -= min(size, cap)

    def name(path: Path) -> str:
        return path.relative_to(root).as_posix() if root is not None and path.is_relative_to(root) else str(path)

    skipped = [name(path) for path in ordered if limits.get(path) == 0]
    cut = [f"{name(path)} after {limits[path]} bytes" for path in ordered if limits.get(path)]
    if not skipped and not cut:
        return limits, ""
    listed = ", ".join(skipped[:5]) + (f" and {len(skipped) - 5} more" if len(skipped) > 5 else "")
    line = (f"compressed logs inflate past the total budget of {budget} bytes: " + "; ".join(
        part for part in (f"not read: {listed}" if skipped else "", f"read short: {', '.join(cut)}" if cut else "")
        if part))
    return limits, line


def inflation_could_pass(files: list[list[Path]], budget: int) -> bool:
    """Whether the compressed files among ``files`` could inflate past ``budget`` (each one's bound - the cap, or for
    gzip 1,032 times its size - summed)."""
    return sum(_inflated_bound(path) for stream in files for path in stream
               if path.suffix.lower() in COMPRESSED) > budget


def _inflated_bound(path: Path) -> int:
    try:
        size = path.stat().st_size
    except OSError:
        return 0
    return min(MAX_INFLATED_BYTES, size * 1032) if path.suffix.lower() == ".gz" else MAX_INFLATED_BYTES


def _inflated_size(path: Path, limit: int) -> int:
    """Inflated bytes of a compressed file, counted up to ``limit`` (a file that cannot be read counts 0)."""
    opener = COMPRESSED[path.suffix.lower()]
    total = 0
    try:
        with opener(path, "rb") as stream:  # type: ignore[operator]
            while total < limit:
                data = stream.read(min(1 << 20, limit - total))
                if not data:
                    return total
                total += len(data)
            return total if not stream.read(1) else limit
    except (EOFError, OSError, lzma.LZMAError, zlib.error):
        return total


MAX_LINE_BYTES = 64 * 1024


def _bounded_lines(handle: BinaryIO) -> Iterator[bytes]:
    reader = handle.readline
    while True:
        raw: bytes = reader(MAX_LINE_BYTES)
        if not raw:
            return
        if len(raw) == MAX_LINE_BYTES and not raw.endswith(b"\n"):
            while True:  # drop the rest of an over-long line
                rest: bytes = reader(MAX_LINE_BYTES)
                if not rest or rest.endswith(b"\n"):
                    break
        yield raw
