"""Reading vigil launch's diagnosis.json and building the stack tree with its fork point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vigil.faces.api.hang import StackNode, find_reports, load_hang_report, stack_tree
from vigil.faces.api.svg import ring
from vigil.model import VigilInputError

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "serve" / "hang_run"


def test_report_and_fork_point_from_fixture() -> None:
    report = load_hang_report(FIXTURE)
    assert report.verdict == "hang" and report.culprit_ranks == [5] and report.culprit_links == [(5, 6)]
    assert report.world_size == 8 and len(report.stacks) == 8
    assert report.diagnosis.fork_point is not None and report.diagnosis.fork_point.parent == "train_step (train.py:40)"
    assert [c.ranks for c in report.diagnosis.stack_classes] == [[0, 1, 2, 3, 4, 6, 7], [5]]
    tree = stack_tree(report.stacks, report.fork_point)
    marked = [n for n in _walk(tree) if n.is_fork_point]
    assert [(n.frame, n.ranks) for n in marked] == [("load_batch (data.py:12)", [5])]


def test_fork_point_is_computed_when_not_named(tmp_path: Path) -> None:
    stacks = {0: ["a", "b", "c"], 1: ["a", "b", "c"], 2: ["a", "b", "x"]}
    tree = stack_tree(stacks)
    assert tree.children[0].children[0].frame == "b" and tree.children[0].children[0].is_fork_point
    (tmp_path / "diagnosis.json").write_text(json.dumps({"verdict": "ok", "stacks": {"0": ["f (m.py:3)"]}}))
    assert load_hang_report(tmp_path).stacks == {0: ["f (m.py:3)"]}
    # The hang view reads one typed diagnosis: a frame that is not a string is refused, not guessed at.
    (tmp_path / "diagnosis.json").write_text(json.dumps({"verdict": "ok", "stacks": {"0": [{"name": "f"}]}}))
    with pytest.raises(VigilInputError, match="stacks"):
        load_hang_report(tmp_path)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not valid JSON"),
        ('{"verdict": "weird"}', "verdict"),
        ("[1]", "JSON object"),
        ('{"verdict": "hang", "culprit_ranks": ["x"]}', "culprit_ranks"),
    ],
)
def test_bad_report_is_one_clear_error(tmp_path: Path, content: str, message: str) -> None:
    (tmp_path / "diagnosis.json").write_text(content)
    with pytest.raises(VigilInputError, match=message):
        load_hang_report(tmp_path)


def test_missing_report_and_discovery(tmp_path: Path) -> None:
    with pytest.raises(VigilInputError, match="no such file"):
        load_hang_report(tmp_path / "nowhere")
    (tmp_path / "run1").mkdir()
    (tmp_path / "run1" / "diagnosis.json").write_text('{"verdict": "ok"}')
    assert list(find_reports([tmp_path])) == ["run1"]


def test_ring_marks_culprit_link_and_rank() -> None:
    svg = ring(8, [(5, 6)], [5])
    assert svg.count('class="link culprit"') == 1 and 'data-link="5-6"' in svg
    assert svg.count('class="rank culprit"') == 1


def test_real_launch_output_p2p_hang() -> None:
    """diagnosis.json as `vigil launch` wrote it for a missing p2p recv in a 3-rank ring exchange."""
    report = load_hang_report(FIXTURE.parent / "launch_p2p")
    assert report.verdict == "hang" and report.hang_kind == "p2p"
    assert report.culprit_links == [(1, 2)] and report.world_size == 3 and len(report.stacks) == 3
    tree = stack_tree(report.stacks, report.fork_point)
    marked = [n for n in _walk(tree) if n.is_fork_point]
    assert [n.frame for n in marked] == ["ring_exchange (probe/fault_job.py:92)"] and marked[0].ranks == [1]
    assert 'data-link="1-2"' in ring(report.world_size, report.culprit_links, report.culprit_ranks)


def _walk(node: StackNode) -> list[StackNode]:
    return [node, *(n for child in node.children for n in _walk(child))]
