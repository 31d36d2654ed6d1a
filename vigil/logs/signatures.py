"""Error signatures for GPU training logs: the curated library in ``signatures.yaml`` and its matcher.

``load_signatures()`` gives every signature as a :class:`Signature` (id, fault_type, pattern, level, role,
description); ``fault_types()`` gives the single list of fault type names they map to, which the
knowledge base seeds its fault nodes from. :class:`SignatureMatcher` finds the first signature a line
matches; NVRM Xid lines are decoded with the Xid catalogue (``vigil.detect.xid``) for their level.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from vigil.detect.xid import parse_xid_line, xid_info
from vigil.model import FaultLevel, VigilInputError, describe_validation_error

Role = Literal["root", "cascade"]

# A line longer than this is matched on its head and tail only: error text is never megabytes long,
# and regexes over a 1 MB line would turn one hostile line into seconds of work.
MAX_MATCH_CHARS = 4096


class Signature(BaseModel):
    """One known error line: what it looks like and what fault it means."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    fault_type: str
    pattern: str
    level: FaultLevel
    description: str
    role: Role

    @field_validator("level", mode="before")
    @classmethod
    def _level_by_name(cls, value: Any) -> Any:
        return FaultLevel.parse(value) if isinstance(value, str) else value

    @property
    def regex(self) -> re.Pattern[str]:
        return _compiled(self.pattern)


@lru_cache(maxsize=512)
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


@dataclass(frozen=True)
class SignatureHit:
    """A line that matched a signature; ``fault_type`` and ``level`` may be refined (Xid decoding)."""

    signature: Signature
    fault_type: str
    level: FaultLevel
    attrs: dict[str, Any] = field(default_factory=dict)


@lru_cache(maxsize=1)
def _library() -> dict[str, Any]:
    text = resources.files("vigil.logs").joinpath("signatures.yaml").read_text(encoding="utf-8")
    return parse_library(text, "vigil/logs/signatures.yaml")


def parse_library(text: str, where: str) -> dict[str, Any]:
    """Parse and check a signature library; every problem is one line naming the entry."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise VigilInputError(f"{where} is not valid YAML: {str(err).splitlines()[0]}") from None
    if not isinstance(data, dict) or not isinstance(data.get("signatures"), list):
        raise VigilInputError(f"{where}: expected a mapping with fault_types and a signatures list")
    types = data.get("fault_types") or {}
    if not isinstance(types, dict):
        raise VigilInputError(f"{where}: fault_types must map each name to a description")
    signatures: list[Signature] = []
    seen: set[str] = set()
    for position, entry in enumerate(data["signatures"]):
        try:
            signature = Signature.model_validate(entry)
        except ValidationError as err:
            problem = describe_validation_error(err)
            raise VigilInputError(f"{where}: signature #{position}: {problem}") from None
        if signature.id in seen:
            raise VigilInputError(f"{where}: signature id {signature.id!r} appears twice")
        if signature.fault_type not in types:
            raise VigilInputError(
                f"{where}: signature {signature.id!r} maps to unknown fault type {signature.fault_type!r}")
        try:
            _compiled(signature.pattern)
        except re.error as err:
            raise VigilInputError(f"{where}: signature {signature.id!r} has a bad pattern: {err}") from None
        seen.add(signature.id)
        signatures.append(signature)
    xid_types: dict[int, str] = {}
    for fault_type, codes in (data.get("xid_fault_types") or {}).items():
        if fault_type not in types:
            raise VigilInputError(f"{where}: xid_fault_types names unknown fault type {fault_type!r}")
        for code in codes:
            xid_types[int(code)] = fault_type
    return {"fault_types": dict(types), "signatures": signatures, "xid_fault_types": xid_types}


def load_signatures() -> list[Signature]:
    """Every signature, in match order (specific before generic)."""
    return list(_library()["signatures"])


def fault_types() -> dict[str, str]:
    """The fault type names the signatures map to, with a one-line description each."""
    return dict(_library()["fault_types"])


def xid_fault_type(code: int) -> str:
    return str(_library()["xid_fault_types"].get(code, "gpu_xid_error"))


def _screen(pattern: str) -> Any:
    """The combined screen, compiled with RE2 where it accepts the pattern: RE2 tries every alternative in
    one linear pass, where Python's backtracking engine tries them one by one at every position (12x slower
    per line on 32 signatures). A pattern RE2 cannot compile (look-arounds, back-references) keeps ``re``;
    the screen only decides which lines the signatures are tried on, both engines agree on that
    (tests/logs/test_signatures.py)."""
    try:
        import re2
    except ImportError:
        return re.compile(pattern)
    try:
        return re2.compile(pattern)
    except re2.error:
        return re.compile(pattern)


class SignatureMatcher:
    """Finds the first signature a line matches.

    One combined regex (every pattern, its groups made non-capturing) screens each line; only the rare
    lines it hits are tried against the signatures one by one, in priority order.
    """

    def __init__(self, signatures: list[Signature] | None = None) -> None:
        self.signatures = load_signatures() if signatures is None else signatures
        screens = [re.sub(r"\(\?P<\w+>", "(?:", s.pattern) for s in self.signatures]
        flags = [s for s in screens if s.startswith("(?i)")]
        plain = [s for s in screens if not s.startswith("(?i)")]
        alternatives = [f"(?:{s})" for s in plain] + [f"(?i:{s[4:]})" for s in flags]
        self._screen = _screen("|".join(alternatives))

    def match(self, line: str) -> SignatureHit | None:
        if len(line) > MAX_MATCH_CHARS:
            line = line[: MAX_MATCH_CHARS // 2] + " " + line[-MAX_MATCH_CHARS // 2 :]
        if self._screen.search(line) is None:
            return None
        for signature in self.signatures:
            found = signature.regex.search(line)
            if found is None:
                continue
            attrs = {k: v for k, v in found.groupdict().items() if v is not None}
            if signature.id == "nvrm.xid":
                return _xid_hit(signature, line, attrs)
            return SignatureHit(signature, signature.fault_type, signature.level, attrs)
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
    return SignatureHit(signature, xid_fault_type(code), info.level, attrs)
