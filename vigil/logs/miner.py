"""Streaming log template miner: number-blind caches, masking, and similarity clustering of the rest.

How a block of lines finds its templates:

1. Cache by the line with every digit turned into 0 (``str.translate`` and a dict lookup per line, no
   regex): almost every line of a long log hits it.
2. For the misses, cache by the line with every number turned into a single 0.
3. Only lines never seen in that form are masked by :mod:`vigil.logs.masking` (values become ``<*>``),
   one representative per form, in one regex pass; the masked form is compared with the templates of
   the same token count and first token, and the most similar one absorbs it when at most
   ``1 - sim_threshold`` of its tokens differ (those become ``<*>``); otherwise it starts a template.

Masking never looks at which digit a number has nor how many, which is what makes steps 1 and 2 exact.
Memory is bounded: each cache is cleared when it reaches ``max_cache`` keys (it is rebuilt from the
templates on demand) and at most ``max_templates`` templates are kept, the least recently learned one
being dropped first. The state saves to and loads from a JSON file, so mining survives a restart.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from vigil.logs.masking import WILDCARD, mask, tokenize
from vigil.model import VigilInputError

STATE_VERSION = 1
_DIGITS_TO_ZERO = str.maketrans("123456789", "000000000")
_HAS_DIGIT = re.compile(r"\d")


def _one_zero_per_number(digitless: str) -> str:
    """Shrink every run of 0s to one. Halving passes of C-level ``str.replace`` beat a regex here."""
    while "00" in digitless:
        digitless = digitless.replace("0000", "0").replace("00", "0")
    return digitless


@dataclass
class Template:
    """One mined template: ``tokens`` with ``<*>`` at the variable positions."""

    id: str
    tokens: list[str]
    size: int = 0
    last_seen: int = 0

    @property
    def text(self) -> str:
        return " ".join(self.tokens)


@dataclass(frozen=True)
class Match:
    template_id: str
    template: str


@dataclass
class TemplateMiner:
    """Mines templates from a stream of log lines; ``add`` / ``add_block`` return one match per line."""

    sim_threshold: float = 0.9
    max_templates: int = 50_000
    max_cache: int = 200_000
    templates: dict[str, Template] = field(default_factory=dict)
    _cache: dict[str, Template] = field(default_factory=dict, repr=False)
    _digit_cache: dict[str, Template] = field(default_factory=dict, repr=False)
    _width_cache: dict[str, Template] = field(default_factory=dict, repr=False)
    _by_shape: dict[tuple[int, str], list[Template]] = field(default_factory=dict, repr=False)
    _next_id: int = 1
    _clock: int = 0

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
        return found  # type: ignore[return-value]

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
            masked = mask("\n".join(flat[missing[j]] for _, j in unseen)).split("\n")
            learned: dict[str, Template] = {}
            for (width_key, _), key in zip(unseen, masked, strict=True):
                fresh = self._cache.get(key) or self._learn(key)
                if not _HAS_DIGIT.search(key):  # else a digit survived: the number-free form is not a safe key
                    learned[width_key] = fresh
            self._remember_all(self._width_cache, learned)
            resolved = [t if t is not None else learned.get(k) for t, k in zip(resolved, widthless, strict=True)]
            for j, known in enumerate(resolved):
                if known is None:  # rare: lines whose masked form keeps a digit
                    key = mask(flat[missing[j]])
                    resolved[j] = self._cache.get(key) or self._learn(key)
        safe = {k: t for k, t, w in zip(missing_digitless, resolved, widthless, strict=True) if w in self._width_cache}
        self._remember_all(self._digit_cache, safe)  # type: ignore[arg-type]
        for i, known in zip(missing, resolved, strict=True):
            found[i] = known

    def _remember_all(self, cache: dict[str, Template], entries: dict[str, Template]) -> None:
        if len(cache) + len(entries) > self.max_cache:
            cache.clear()  # rebuilt from the templates on demand; clearing keeps memory bounded
        if len(entries) <= self.max_cache:
            cache.update(entries)

    def _remember(self, cache: dict[str, Template], key: str, template: Template) -> None:
        if len(cache) >= self.max_cache:
            cache.clear()  # rebuilt from the templates on demand; clearing keeps memory bounded
        cache[key] = template

    def match(self, line: str) -> Match | None:
        """The template a line belongs to, without learning anything."""
        key = mask(line.replace("\n", " "))
        template = self._cache.get(key) or self._best(tokenize(key), require_exact=True)
        return None if template is None else Match(template.id, template.text)

    def _learn(self, key: str) -> Template:
        tokens = tokenize(key) or [""]
        template = self._best(tokens, require_exact=False)
        if template is None:
            template = self._create(tokens)
        else:
            self._generalize(template, tokens)
        template.size += 1
        template.last_seen = self._clock
        self._remember(self._cache, key, template)
        return template

    @staticmethod
    def _shape(tokens: list[str]) -> tuple[int, str]:
        first = tokens[0] if tokens else ""
        return (len(tokens), first)

    def _best(self, tokens: list[str], require_exact: bool) -> Template | None:
        candidates = self._by_shape.get(self._shape(tokens), [])
        if tokens and tokens[0] != WILDCARD:
            candidates = candidates + self._by_shape.get((len(tokens), WILDCARD), [])
        best: Template | None = None
        best_score = -1.0
        allowed = int(len(tokens) * (1.0 - self.sim_threshold) + 1e-9)
        for template in candidates:
            same = sum(1 for mine, theirs in zip(template.tokens, tokens, strict=True)
                       if mine in (theirs, WILDCARD))
            differing = len(tokens) - same
            if differing > (0 if require_exact else allowed):
                continue
            score = same / max(len(tokens), 1)
            if score > best_score:
                best, best_score = template, score
        return best

    def _create(self, tokens: list[str]) -> Template:
        if len(self.templates) >= self.max_templates:
            self._evict()
        template = Template(id=f"t{self._next_id}", tokens=list(tokens))
        self._next_id += 1
        self.templates[template.id] = template
        self._by_shape.setdefault(self._shape(tokens), []).append(template)
        return template

    def _generalize(self, template: Template, tokens: list[str]) -> None:
        for i, token in enumerate(tokens):
            if template.tokens[i] != token:
                template.tokens[i] = WILDCARD

    def _evict(self) -> None:
        oldest = min(self.templates.values(), key=lambda t: t.last_seen)
        del self.templates[oldest.id]
        for bucket in self._by_shape.values():
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
            "sim_threshold": self.sim_threshold,
            "next_id": self._next_id,
            "clock": self._clock,
            "templates": [
                {"id": t.id, "tokens": t.tokens, "size": t.size, "last_seen": t.last_seen}
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
        try:
            state = json.loads(path.read_text(encoding="utf-8"))
            if state.get("version") != STATE_VERSION:
                raise VigilInputError(
                    f"template state {path}: version {state.get('version')!r}, expected {STATE_VERSION}"
                )
            params.setdefault("sim_threshold", float(state["sim_threshold"]))
            miner = cls(**params)  # type: ignore[arg-type]
            for item in state["templates"]:
                tokens = [str(tok) for tok in item["tokens"]]
                template = Template(str(item["id"]), tokens, int(item["size"]), int(item["last_seen"]))
                miner.templates[template.id] = template
                miner._by_shape.setdefault(cls._shape(tokens), []).append(template)
            miner._next_id = int(state["next_id"])
            miner._clock = int(state["clock"])
        except (ValueError, KeyError, TypeError) as err:
            raise VigilInputError(f"template state {path} is not a valid miner state: {err}") from None
        return miner


def read_lines(path: Path, block_size: int = 4096) -> Iterator[list[str]]:
    """Lines of a file in blocks, decoded leniently: invalid UTF-8 and NUL bytes never stop a parse.

    Lines longer than 64 KiB are cut (the rest is still read and dropped) so one giant line cannot
    blow up memory or the template table.
    """
    try:
        handle = path.open("rb")
    except OSError as err:
        raise VigilInputError(f"cannot read log file {path}: {err.strerror or err}") from None
    with handle:
        block: list[str] = []
        for raw in _bounded_lines(handle):
            block.append(raw.decode("utf-8", errors="replace").replace("\x00", " ").rstrip("\r\n"))
            if len(block) >= block_size:
                yield block
                block = []
        if block:
            yield block


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
