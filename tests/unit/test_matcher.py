"""The trigger prefilter and the rule patterns: RE2 and `re` find the same matches."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import re2

from trainmedic.catalog import Matcher, load_catalog
from trainmedic.catalog.matcher import (
    compile_prefilter,
    linear_regex,
    literal_alternation,
    needs_python_re,
)

CATALOG = load_catalog()
RE2 = Matcher(CATALOG)
PLAIN = Matcher(CATALOG, use_re2=False)

BENIGN = [
    b"[rank3]: iteration 10/ 500 | lm loss: 2.1E+00 | number of nan iterations: 0 |",
    b"gpu01:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read",
    b"validation error rate: 0.012 | eval loss 1.3",
]


def _examples() -> list[bytes]:
    return [e.encode() for rule in CATALOG.rules for e in rule.examples]


def test_the_catalog_uses_re2_and_the_fallback_is_plain_re() -> None:
    assert type(RE2.prefilter).__module__.startswith("re2")
    assert type(PLAIN.prefilter).__module__ == "re"


@pytest.mark.parametrize("matcher", [RE2, PLAIN], ids=["re2", "re"])
def test_every_example_passes_the_prefilter_and_benign_lines_do_not(matcher: Matcher) -> None:
    for line in _examples():
        assert matcher.prefilter.search(line), line
    for line in BENIGN:
        assert matcher.prefilter.search(line) is None, line


def test_re2_and_re_find_the_same_candidate_lines() -> None:
    rng = random.Random(3)
    lines = _examples() + BENIGN * 50
    rng.shuffle(lines)
    blob = b"\n".join(lines)

    def candidates(matcher: Matcher) -> set[int]:
        return {blob.count(b"\n", 0, hit.start()) for hit in matcher.prefilter.finditer(blob)}

    assert candidates(RE2) == candidates(PLAIN)
    assert len(candidates(RE2)) == len(_examples())


def test_search_honours_pos_and_endpos_on_bytearray() -> None:
    buf = bytearray(b"xx Killed yy\nzz Killed")
    for prefilter in (RE2.prefilter, PLAIN.prefilter):
        first = prefilter.search(buf, 0, len(buf))
        assert first is not None and first.start() == 3
        second = prefilter.search(buf, first.end(), len(buf))
        assert second is not None and second.start() == 16
        assert prefilter.search(buf, first.end(), 15) is None


def test_case_insensitive_triggers_match_any_spelling_with_re2() -> None:
    line = "nvml: gpu 5 eCC_UnCorrectable_Volatile=3"
    assert RE2.prefilter.search(line.encode())
    assert [m.rule.id for m in RE2.match(line)] == ["kernel.nvml_ecc_dbe"]
    # The re fallback only knows three spellings: the reason RE2 folds case itself.
    assert PLAIN.prefilter.search(line.encode()) is None


def test_literal_alternation_drops_covered_words_and_groups_case_insensitive_ones() -> None:
    pattern = literal_alternation(["Error", "CUDA error", "Xid", "ECC page"], ["ecc", "Remap"])
    alternatives = pattern.decode().split("|(?i:")
    assert alternatives[0].split("|") == ["Xid", "Error", r"CUDA\ error"]
    assert alternatives[1] == "ecc|remap)"
    assert literal_alternation([], []) == b"(?!)"


def test_empty_trigger_set_matches_nothing() -> None:
    for use_re2 in (True, False):
        assert compile_prefilter([], [], use_re2=use_re2).search(b"anything at all") is None


def test_match_gives_the_same_rules_with_and_without_re2() -> None:
    lines = [e for r in CATALOG.rules for e in (*r.examples, *r.non_examples)]
    lines += [b.decode() for b in BENIGN] + ["nvml: gpu 2 ECC_UNCORRECTABLE_VOLATILE=1"]
    for line in lines:
        with_re2 = [(m.rule.id, m.xid) for m in RE2.match(line)]
        assert with_re2 == [(m.rule.id, m.xid) for m in PLAIN.match(line)], line
    assert [m.rule.id for m in RE2.match(lines[-1])] == ["kernel.nvml_ecc_dbe"]


@pytest.mark.parametrize("matcher", [RE2, PLAIN], ids=["re2", "re"])
def test_named_groups_say_whom_a_line_blames(matcher: Matcher) -> None:
    line = (
        "RuntimeError: Detected mismatch between collectives on ranks. Rank 1 is running "
        "collective: CollectiveFingerPrint(SequenceNumber=21, OpType=BROADCAST)"
    )
    (hit,) = [m for m in matcher.match(line) if m.rule.id == "torch.collective_mismatch"]
    assert hit.rank == 1 and hit.host is None
    line = "srun: error: Task launch for 36.0 failed on node cn131: Job credential expired"
    (hit,) = [m for m in matcher.match(line) if m.rule.id == "slurm.task_launch_failed"]
    assert hit.host == "cn131"
    line = "[rank6]:[E904 ProcessGroupNCCL.cpp:1834] Timeout at NCCL work: 70005, last enqueued"
    (hit,) = [m for m in matcher.match(line) if m.rule.id == "nccl.watchdog_timeout"]
    assert hit.seq == 70005


def test_context_rules_give_way_on_lines_other_rules_explain() -> None:
    line = (
        "[rank0]:[E ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective operation "
        "timeout: WorkNCCL(SeqNum=9) ran for 600100 milliseconds before timing out."
    )
    assert [m.rule.id for m in RE2.match(line)] == ["nccl.watchdog_timeout"]


@pytest.mark.parametrize("matcher", [RE2, PLAIN], ids=["re2", "re"])
def test_an_xid_whose_pci_address_was_redacted_is_still_read(matcher: Matcher) -> None:
    # Public reports often hide the address ("(PCI:...)"); the Xid is what matters, and
    # no GPU is made up from the placeholder.
    for line in (
        "kernel: NVRM: Xid (PCI:...): 145, RLW_RXPIPE Nonfatal XC0 i0 Link 11 (...)",
        "NVRM: Xid (PCI:xxxx:xx:xx): 145, pid=1, RLW error",
    ):
        assert [m.rule.id for m in matcher.match(line)] == ["kernel.xid_145"], line
    real = matcher.match("NVRM: Xid (PCI:0000:3b:00): 145, RLW_RXPIPE Nonfatal")
    assert [m.rule.id for m in real] == ["kernel.xid_145"]


def test_rule_patterns_run_on_re2_unless_re2_cannot_express_them() -> None:
    # A job's log is its owner's input: on RE2 no line makes a pattern backtrack. The
    # screen is exact on the catalog: what it keeps from RE2 is what RE2 refuses, so RE2
    # never logs a parse error at start-up and nothing expressible is left to `re`.
    left_to_re = {regex for _, regex in RE2.on_python_re}
    for rule in CATALOG.rules:
        if rule.xid is not None:
            continue  # the Xid rules share one regex, with the number dispatched after
        for pattern in rule.patterns:
            try:
                re2.compile(pattern.regex)
                expressible = True
            except re2.error:
                expressible = False
            assert needs_python_re(pattern.regex) is (not expressible), rule.id
            assert (pattern.regex in left_to_re) is (not expressible), rule.id
    # Lookarounds mostly; a new one is a choice, not a slip (the 20th: slurm's task launch
    # failure without a revoked credential, 2026-12-03).
    assert len(left_to_re) <= 20
    assert {rule for rule, _ in PLAIN.on_python_re} == {
        rule.id for rule in CATALOG.rules if rule.xid is None and rule.patterns
    }


def _corpus_lines() -> list[str]:
    root = Path(__file__).resolve().parents[1] / "corpus"
    return [
        line
        for path in sorted(root.rglob("*.log"))
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines()
    ]


def test_re2_and_re_patterns_find_the_same_matches_on_real_and_own_lines() -> None:
    # RE2's \d, \w, \s and \b are ASCII where re's are Unicode: on every line of the
    # corpora (real excerpts nobody here wrote, and our own) and every example, both
    # engines must name the same rules with the same captured ranks, hosts and sequences.
    examples = [t for rule in CATALOG.rules for t in (*rule.examples, *rule.non_examples)]
    lines = _corpus_lines() + examples
    assert len(lines) > 5000
    differ = [line for line in lines if RE2.match(line) != PLAIN.match(line)]
    assert differ == []


@pytest.mark.parametrize(
    ("regex", "backtracks"),
    [
        (r"a*+b", True),  # possessive
        (r"x{2,5}+", True),
        (r"a?+", True),
        (r"(a)\1", True),  # backreference
        (r"(?=a)b", True),
        (r"(?<!a)b", True),
        (r"(?>ab)c", True),  # atomic group
        (r"x{0,2000}", True),  # RE2 counts to 1000
        (r"a*?b", False),  # lazy, which RE2 has
        (r"x{2,5}?", False),
        (r"a??", False),
        (r"\*+ GSP", False),  # an escaped star, repeated
        (r"[*+]+", False),  # a class of literals
        (r"[\]+]+", False),
        (r"[]a]+", False),
        (r"(?:a)(?P<rank>\d+)", False),
        (r"(?i)abc", False),  # flags RE2 has
        (r"(?s:.)", False),
        # RE2 would read these differently without a word:
        (r"a{,5}", True),  # a repeat to re, text to RE2
        (r"[[:alpha:]]", True),  # a set to re, a POSIX class to RE2
        (r"[x[:alpha:]]", True),
        # and refuse these, logging a parse error:
        (r"end\Z", True),
        (r"caf\u00e9", True),
        (r"(?x) a b", True),
        (r"(?#comment)a", True),
        (r"(a)?(?(1)b|c)", True),
        (r"[\1]", True),
    ],
)
def test_needs_python_re_knows_what_re2_cannot_express(regex: str, backtracks: bool) -> None:
    assert needs_python_re(regex) is backtracks
    assert (linear_regex(regex, ignore_case=False) is None) is backtracks


def test_a_lone_surrogate_does_not_break_matching() -> None:
    # Evidence that arrived as JSON may carry one; a decoded log line never does.
    line = "\ud800 NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus."
    assert {m.rule.id for m in RE2.match(line)} == {m.rule.id for m in PLAIN.match(line)}
    assert "kernel.xid_79" in {m.rule.id for m in RE2.match(line)}


def test_linear_patterns_keep_case_folding_and_named_groups() -> None:
    pattern = linear_regex(r"rank (?P<rank>\d+) failed", ignore_case=True)
    assert pattern is not None
    hit = pattern.search("[E] RANK 12 FAILED")
    assert hit is not None and hit.groupdict() == {"rank": "12"}
    assert linear_regex("rank", ignore_case=False).search("RANK") is None  # type: ignore[union-attr]
