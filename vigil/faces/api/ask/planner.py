"""The deterministic planner: a question matched against the flows of ``ask_flows.yaml``, its tool steps run
in order, and the answer rendered from the template - every value in it cited by the id of the tool-result
field it came from, so ``check_answer`` can trace each fact back."""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from vigil.faces.api.ask.tools import Toolbox, ToolResult
from vigil.knowledge.files import kb_dir, read_data
from vigil.model import VigilInputError

_REF = re.compile(r"\{([^{}]*)\}")


class FlowStep(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    tool: str
    args: dict[str, Any] = Field(default_factory=dict)
    # a step that only finds a default: skipped when the question names this parameter
    unless: str | None = None


class Sentence(BaseModel):
    model_config = ConfigDict(extra="forbid")

    say: str
    each: str | None = None
    empty: str | None = None
    limit: int = Field(default=20, ge=1, le=200)


class Flow(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    description: str
    # questions the flow answers, shown to people and to other agents (the A2A card's skill examples)
    examples: list[str] = Field(default_factory=list)
    patterns: list[str] = Field(min_length=1)
    steps: list[FlowStep] = Field(min_length=1)
    answer: list[Sentence] = Field(min_length=1)

    @field_validator("patterns")
    @classmethod
    def _compiles(cls, value: list[str]) -> list[str]:
        for pattern in value:
            try:
                re.compile(pattern)
            except re.error as err:
                raise ValueError(f"pattern {pattern!r} is not a regular expression: {err}") from None
        return value


class FlowFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: int
    flows: list[Flow] = Field(min_length=1)


def load_flows(path: Path | None = None) -> list[Flow]:
    return read_data(path or kb_dir().parent / "ask_flows.yaml", FlowFile, "flow file").flows


@lru_cache(maxsize=1)
def flows() -> list[Flow]:
    return load_flows()


class Fact(BaseModel):
    cite: str
    value: Any


class AnswerLine(BaseModel):
    text: str
    facts: list[Fact] = Field(default_factory=list)


class StepRecord(BaseModel):
    id: str
    tool: str
    args: dict[str, Any]
    result: dict[str, Any] | None = None
    skipped: str = ""


class Proposal(BaseModel):
    """An action a model proposed: checked against the whitelist, never executed."""

    action: str
    target: str
    reason: str = ""
    accepted: bool
    why: str = ""


class Answer(BaseModel):
    question: str
    flow: str | None
    answered_by: str
    steps: list[StepRecord]
    answer: list[AnswerLine]
    proposals: list[Proposal] = Field(default_factory=list)
    note: str = ""


def match(question: str, catalogue: list[Flow] | None = None) -> tuple[Flow, dict[str, str]]:
    """The first flow one of whose patterns matches, with the named groups it captured."""
    for flow in catalogue or flows():
        for pattern in flow.patterns:
            found = re.search(pattern, question, flags=re.IGNORECASE)
            if found:
                params = {k: v.strip().rstrip("?.!") for k, v in found.groupdict().items() if v}
                return flow, params
    known = "; ".join(f.description for f in catalogue or flows())
    raise VigilInputError(f"no flow answers {question!r}; the planner knows: {known} "
                          "(configure an LLM endpoint for other questions)")


def resolve(ref: str, results: dict[str, ToolResult]) -> tuple[str, Any] | None:
    """(citation id, value) of ``step.path`` in the results, or None when it is not there."""
    facts = {}
    step = ref.split(".", 1)[0]
    if step not in results:
        return None
    facts = results[step].facts()
    if ref in facts:
        return ref, facts[ref]
    subtree = results[step].result.model_dump(mode="json")
    for part in ref.split(".")[1:]:
        if isinstance(subtree, dict) and part in subtree:
            subtree = subtree[part]
        elif isinstance(subtree, list) and part.isdigit() and int(part) < len(subtree):
            subtree = subtree[int(part)]
        else:
            return None
    return ref, subtree


def fill_arg(value: Any, params: dict[str, str], results: dict[str, ToolResult]) -> Any:
    """A step argument: ``{param|step.path}`` takes the question's parameter, else the earlier result."""
    if not isinstance(value, str):
        return value
    missing: list[str] = []

    def one(found: re.Match[str]) -> str:
        for choice in found.group(1).split("|"):
            if choice in params:
                return params[choice]
            got = resolve(choice, results)
            if got is not None and got[1] is not None and not isinstance(got[1], dict | list):
                return str(got[1])
        missing.append(found.group(1))
        return ""

    filled = _REF.sub(one, value)
    if missing:
        raise LookupError(", ".join(missing))
    return filled


def _render(template: str, lookup: Callable[[str], tuple[str, Any] | None]) -> AnswerLine | None:
    facts: list[Fact] = []
    gone = False

    def one(found: re.Match[str]) -> str:
        nonlocal gone
        got = lookup(found.group(1))
        if got is None or got[1] is None or isinstance(got[1], dict | list):
            gone = True
            return ""
        facts.append(Fact(cite=got[0], value=got[1]))
        return _show(got[1])

    text = _REF.sub(one, template)
    return None if gone or not text.strip() else AnswerLine(text=text, facts=facts)


def _show(value: Any) -> str:
    if isinstance(value, float):
        # four significant digits without an exponent (1594000, not 1.594e+06), so a reader - and the claim
        # check - reads the number whole
        return np.format_float_positional(value, precision=4, unique=False, fractional=False, trim="-")
    return str(value)


def render_answer(flow: Flow, results: dict[str, ToolResult]) -> list[AnswerLine]:
    lines: list[AnswerLine] = []
    for sentence in flow.answer:
        if sentence.empty is not None:
            got = resolve(sentence.empty, results)
            if got is None or got[1] != []:
                continue
        if sentence.each is None:
            line = _render(sentence.say, lambda ref: resolve(ref, results))
            if line is not None:
                lines.append(line)
            continue
        listed = resolve(sentence.each, results)
        if listed is None or not isinstance(listed[1], list):
            continue
        for index in range(min(len(listed[1]), sentence.limit)):
            base = f"{sentence.each}.{index}"

            def lookup(ref: str, base: str = base) -> tuple[str, Any] | None:
                if ref == ".":
                    return resolve(base, results)
                return resolve(base + ref if ref.startswith(".") else ref, results)

            line = _render(sentence.say, lookup)
            if line is not None:
                lines.append(line)
    return lines


def run_flow(toolbox: Toolbox, flow: Flow, params: dict[str, str],
             on_step: Callable[[StepRecord], None] | None = None) -> tuple[list[StepRecord], dict[str, ToolResult]]:
    """Run the flow's steps in order; a step whose argument cannot be filled is skipped, and so is what needs it."""
    results: dict[str, ToolResult] = {}
    records: list[StepRecord] = []
    for step in flow.steps:
        if step.unless is not None and step.unless in params:
            continue
        try:
            args = {k: fill_arg(v, params, results) for k, v in step.args.items()}
        except LookupError as err:
            record = StepRecord(id=step.id, tool=step.tool, args={}, skipped=f"nothing for {err}")
        else:
            outcome = toolbox.call(step.id, step.tool, args)
            results[step.id] = outcome
            record = StepRecord(id=step.id, tool=step.tool, args=args, result=outcome.as_json()["result"])
        records.append(record)
        if on_step is not None:
            on_step(record)
    return records, results


def plan_answer(toolbox: Toolbox, question: str,
                on_step: Callable[[StepRecord], None] | None = None) -> tuple[Answer, dict[str, ToolResult]]:
    """The deterministic answer to ``question`` and the tool results it rests on."""
    if not question.strip():
        raise VigilInputError("the question is empty")
    flow, params = match(question)
    records, results = run_flow(toolbox, flow, params, on_step)
    lines = render_answer(flow, results)
    return Answer(question=question, flow=flow.name, answered_by="planner", steps=records, answer=lines), results


def check_answer(lines: list[AnswerLine], results: dict[str, ToolResult]) -> list[str]:
    """Problems with the answer's citations: an id no tool returned, or a value that differs from the result's."""
    facts: dict[str, Any] = {}
    for outcome in results.values():
        facts.update(outcome.facts())
    problems = []
    for line in lines:
        for fact in line.facts:
            if fact.cite not in facts:
                problems.append(f"{fact.cite}: no tool result has this id")
            elif facts[fact.cite] != fact.value:
                problems.append(f"{fact.cite}: cited {fact.value!r}, the tool returned {facts[fact.cite]!r}")
    return problems
