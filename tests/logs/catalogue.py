"""What the catalogue surveys (test_node_catalogue, test_training_catalogue, test_cluster_catalogue,
test_runtime_catalogue) assert of each documented message."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from vigil.logs.triage import triage


@dataclass(frozen=True)
class Secondary:
    message: str
    source: str
    cause: str  # the line that must be named when both are present


def assert_root_alone_and_beside(tmp_path: Path, message: str, source: str, signature: str, filename: str,
                                 other: str, other_filename: str) -> None:
    """Alone in ``filename`` the message is named by ``signature``; beside ``other`` in ``other_filename`` (a line the
    ranking puts below it, with no wall-clock time either) it is still the root."""
    alone = tmp_path / "alone"
    alone.mkdir()
    (alone / filename).write_text(message + "\n")
    result = triage(alone)
    assert result.root is not None and result.root_basis == "signature", (source, result.summary)
    assert result.root.signature == signature, (source, result.root.signature)
    both = tmp_path / "both"
    both.mkdir()
    (both / filename).write_text(message + "\n")
    (both / other_filename).write_text(other + "\n")
    result = triage(both)
    assert result.root is not None and result.root.source == filename, (source, result.summary)


def assert_cause_named_after_its_consequence(tmp_path: Path, entry: Secondary, filename: str) -> None:
    """The consequence printed first, in the same file as its cause: the cause (line 2) is named."""
    (tmp_path / filename).write_text(entry.message + "\n" + entry.cause + "\n")
    result = triage(tmp_path)
    assert result.root is not None and (result.root.source, result.root.lineno) == (filename, 2), \
        (entry.source, result.summary)


def assert_consequence_after_its_cause_and_named_alone(tmp_path: Path, entry: Secondary, filename: str) -> None:
    """Beside its cause the cause is named; alone in ``filename`` the consequence is the root (line 1)."""
    both = tmp_path / "both"
    both.mkdir()
    assert_cause_named_after_its_consequence(both, entry, filename)
    alone = tmp_path / "alone"
    alone.mkdir()
    (alone / filename).write_text(entry.message + "\n")
    result = triage(alone)
    assert result.root is not None and result.root.lineno == 1, (entry.source, result.summary)


def assert_benign_never_root(tmp_path: Path, message: str, source: str, filename: str, after: str) -> None:
    """Alone in ``filename`` the benign message is named by no signature; followed by the real error ``after``, the
    error (line 2) is the root."""
    (tmp_path / filename).write_text(message + "\n")
    result = triage(tmp_path)
    assert result.root is None or result.root_basis != "signature", (source, result.summary)
    (tmp_path / filename).write_text(message + "\n" + after + "\n")
    result = triage(tmp_path)
    assert result.root is not None and result.root.lineno == 2, (source, result.summary)
