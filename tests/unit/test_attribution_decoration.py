"""The same log, shown another way, gets the same diagnosis.

Real logs reach the attributor coloured by the terminal (rich, loguru, Ray), quoted in an
issue or a mail ("> "), stamped by a log shipper ("2024-05-01 12:00:00,123 - "), indented
inside other output. None of that changes what happened, so
on every real tune and benign case the category, action and culprits must
come out as they do on the plain text, and a benign case must stay quiet.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from pathlib import Path

import pytest

from trainmedic.catalog import Attributor
from trainmedic.catalog.correlation import Topology, parse_line, undecorate
from trainmedic.domain import AttributionRequest, Category

ENGINE = Attributor()
REAL = Path(__file__).parents[1] / "corpus" / "real"
# tune and benign only: what these tests find is mended in the rules, which the held-out
# eval split never guides.
CASES = sorted(p for split in ("tune", "benign") for p in (REAL / split).glob("*.log"))

DECORATIONS: dict[str, Callable[[str], str]] = {
    "coloured": lambda line: f"\x1b[31m{line}\x1b[0m",
    "quoted": lambda line: f"> {line}",
    "shipped": lambda line: f"2024-05-01 12:00:00,123 - {line}",
    "indented": lambda line: f"    {line}",
}


def _verdict(path: Path) -> tuple[str, str, tuple[str, ...], tuple[int, ...]]:
    diagnosis = ENGINE.attribute(AttributionRequest(log_paths=[str(path)]))
    return (
        diagnosis.category.value,
        diagnosis.action.value,
        tuple(diagnosis.culprit_nodes),
        tuple(diagnosis.culprit_ranks),
    )


@cache
def _plain(case: Path) -> tuple[str, str, tuple[str, ...], tuple[int, ...]]:
    return _verdict(case)


def _changed(tmp_path: Path, rewrite: Callable[[str], str], aspects: int) -> list[str]:
    """Cases whose first `aspects` verdict fields change when every line is rewritten."""
    changed = []
    for case in CASES:
        text = case.read_text(encoding="utf-8", errors="replace")
        rewritten = tmp_path / case.name
        rewritten.write_text("\n".join(rewrite(line) for line in text.splitlines()) + "\n")
        if (got := _verdict(rewritten)[:aspects]) != (want := _plain(case)[:aspects]):
            changed.append(f"{case.parent.name}/{case.name}: {want} -> {got}")
    return changed


@pytest.mark.parametrize("decoration", DECORATIONS)
def test_every_real_case_reads_the_same_decorated(decoration: str, tmp_path: Path) -> None:
    assert _changed(tmp_path, DECORATIONS[decoration], 4) == []


# A launcher's label on every line says who wrote it, not what happened: the category
# and action stay (culprits may be learnt from the label, so they are not compared).
LABELS: dict[str, Callable[[str], str]] = {
    "srun -l": lambda line: f"12: {line}",
    "torchrun": lambda line: f"[default3]:{line}",
}


@pytest.mark.parametrize("label", LABELS)
def test_a_launchers_label_changes_no_verdict(label: str, tmp_path: Path) -> None:
    assert _changed(tmp_path, LABELS[label], 2) == []


# Open MPI's --tag-output names the rank ("[1,12]<stderr>:"). The same tag on every line
# makes every line rank 12's, which a real job never prints: the cases whose verdict
# compares ranks (who is behind, who called another collective) change for that reason
# alone, and pdsh's host prefix is not found behind mpirun's.
_RANKS_COMPARED = {
    "tune/d-075.log",
    "tune/g-090.log",
    "tune/g-675.log",
    "tune/g-438.log",
    "tune/g-1171.log",  # rank 0 gathers another size than ranks 1, 2 and 6
}


def test_open_mpis_rank_tag_changes_no_verdict(tmp_path: Path) -> None:
    changed = _changed(tmp_path, lambda line: f"[1,12]<stderr>:{line}", 2)
    assert [c for c in changed if c.split(":")[0] not in _RANKS_COMPARED] == []


def test_the_corpus_is_there() -> None:
    assert len(CASES) > 400


def test_undecorate_keeps_what_names_a_host() -> None:
    # A syslog line's timestamp is followed by the host: it stays for parse_line.
    line = (
        "2024-05-01T12:00:00+00:00 gpu03 kernel: NVRM: Xid (PCI:0000:3b:00): 79, GPU has "
        "fallen off the bus."
    )
    assert undecorate(line) == line
    assert parse_line(f"> {line}", Topology()).node == "gpu03"


def test_undecorate_strips_colours_quotes_and_stamps() -> None:
    assert undecorate("\x1b[1;31m[rank3]: boom\x1b[0m") == "[rank3]: boom"
    assert undecorate(">> 2024-05-01 12:00:00,123 | [rank3]: boom") == "[rank3]: boom"
    assert parse_line("  [2025-05-10 00:18:27] [rank3]: x", Topology()).rank == 3


def test_a_decorated_benign_line_stays_benign(tmp_path: Path) -> None:
    log = tmp_path / "ok.log"
    log.write_text("\x1b[32m2024-05-01 12:00:00,123 - INFO - step 100 loss 2.31\x1b[0m\n")
    diagnosis = ENGINE.attribute(AttributionRequest(log_paths=[str(log)]))
    assert diagnosis.category is Category.UNKNOWN and diagnosis.rule_ids == []


def test_deep_indentation_does_not_make_a_number_an_srun_label() -> None:
    assert parse_line("          12: RuntimeError: x", Topology()).task is None
    assert parse_line("  12: RuntimeError: x", Topology()).task == 12


def test_evidence_shows_no_colour_codes(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_text(
        "\x1b[31mRuntimeError: CUDA error: an illegal memory access was encountered\x1b[0m\n"
    )
    diagnosis = ENGINE.attribute(AttributionRequest(log_paths=[str(log)]))
    assert diagnosis.evidence and "\x1b" not in diagnosis.evidence[0].text
