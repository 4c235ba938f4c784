"""Score the Attributor against labelled cases as an operator would (`attribution eval`).

A directory of cases holds one file (or one directory) per case and its labels in
`labels.jsonl` and/or `labels.<part>.jsonl` (JSON Lines, one case a line; see
tests/corpus/real/README.md). A label with category "none" is a benign case: healthy or
recovered output on which any diagnosis is a false alarm.

Figures are about what the diagnosis would *do*: a stop that ends a job that would have
run again, a drain of an innocent node and a restart of a job that fails the same way
again are "dangerous" and reported apart from plain misses; culprits are scored per node
(an extra innocent node is an error, not a pass).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from trainmedic.catalog.correlation import short_host
from trainmedic.catalog.engine import Attributor
from trainmedic.catalog.scanner import looks_binary
from trainmedic.domain import (
    ISOLATING,
    RESTART_FAMILY,
    Action,
    AttributionRequest,
    Category,
    Diagnosis,
    SlurmObservation,
)
from trainmedic.domain.hostlist import HostlistError, expand
from trainmedic.errors import TrainmedicError

# Label vocabulary (operator words) -> the taxonomy's actions.
ACTION_ALIASES = {
    "restart": Action.RESTART,
    "restart_excluding_node": Action.RESTART_EXCLUDING,
    "restart_excluding": Action.RESTART_EXCLUDING,
    "drain_node_and_restart": Action.DRAIN_AND_RESTART,
    "drain_and_restart": Action.DRAIN_AND_RESTART,
    "stop_job": Action.STOP,
    "stop": Action.STOP,
    "wait": Action.WAIT,
    "escalate_to_human": Action.ESCALATE,
    "escalate": Action.ESCALATE,
}
BENIGN = "none"  # category and expected_action of a case on which nothing is wrong
# A stop is dangerous where the job would have run again: restarted by us, or requeued
# by the scheduler or the framework itself (wait).
_WOULD_RUN_AGAIN = RESTART_FAMILY | {Action.WAIT}
ASPECTS = ("category", "action", "culprit", "transient")
# Where a label's answer can be read: in the excerpt itself, or only in the source's
# discussion (a maintainer's diagnosis, the reporter's account). A tool that reads logs can
# reach the first; the second bounds what any log reader can score.
Evidence = Literal["excerpt", "thread"]


class InputError(TrainmedicError):
    """A case, log or labels file that cannot be used; the message names it."""


def family(action: Action) -> str:
    """Coarse action: the three restarts are one family; stop, wait, escalate each their own."""
    return "restart" if action in RESTART_FAMILY else action.value


class Label(BaseModel):
    """One labelled case. `culprit` is the self-written corpus's single culprit field."""

    # Unknown keys are refused: a typo ("culprit_node") would otherwise score silently.
    model_config = ConfigDict(extra="forbid")

    file: str = Field(min_length=1)
    source: str | None = None
    category: Category | None  # None: benign ("none")
    expected_action: Action | None  # None: benign ("none")
    culprit_nodes: list[str] = Field(default_factory=list)
    culprit_ranks: list[int] = Field(default_factory=list)
    transient: bool | None = None
    family: str | None = None
    why: str | None = None
    nodelist: str | None = None
    tasks_per_node: int | None = Field(default=None, ge=1)
    # Slurm's NodeAddr (address -> node name), where the source states it.
    node_addrs: dict[str, str] = Field(default_factory=dict)
    slurm: SlurmObservation | None = None
    evidence: Evidence | None = None  # None: nobody has judged where the answer lies

    @model_validator(mode="before")
    @classmethod
    def _legacy_culprit(cls, data: Any) -> Any:
        # The self-written corpus names one culprit: "gpu03" or "rank 5".
        if not isinstance(data, dict) or "culprit" not in data:
            return data
        data = dict(data)
        culprit = data.pop("culprit")
        if culprit is None:
            return data
        if not isinstance(culprit, str):
            raise ValueError("culprit must be a node name, 'rank N' or null")
        if "culprit_nodes" in data or "culprit_ranks" in data:
            raise ValueError("give either culprit or culprit_nodes/culprit_ranks, not both")
        if culprit.startswith("rank "):
            data["culprit_ranks"] = [culprit.split(maxsplit=1)[1]]
        else:
            data["culprit_nodes"] = [culprit]
        return data

    @field_validator("file")
    @classmethod
    def _inside(cls, value: str) -> str:
        # Cases live in the labelled directory; a label must not reach outside it.
        path = Path(value)
        if path.is_absolute() or ".." in path.parts:
            raise ValueError("must be a path inside the corpus directory")
        return value

    @field_validator("category", mode="before")
    @classmethod
    def _benign_category(cls, value: Any) -> Any:
        return None if value == BENIGN else value

    @field_validator("expected_action", mode="before")
    @classmethod
    def _alias(cls, value: Any) -> Any:
        if value == BENIGN:
            return None
        if isinstance(value, str) and value in ACTION_ALIASES:
            return ACTION_ALIASES[value]
        return value

    @model_validator(mode="after")
    def _benign_is_both(self) -> Label:
        if (self.category is None) != (self.expected_action is None):
            raise ValueError('a benign case has category "none" and expected_action "none"')
        if self.category is None and (self.culprit_nodes or self.culprit_ranks):
            raise ValueError("a benign case names no culprit")
        return self

    @property
    def benign(self) -> bool:
        return self.category is None


class CaseResult(BaseModel):
    """One case: what was expected, what the attributor said, and how that scores.

    An `*_ok` of None means the aspect is not scored on this case (benign, or the label
    does not say).
    """

    file: str
    benign: bool
    expected_category: str
    category: Category
    expected_action: str
    action: Action
    expected_culprit_nodes: list[str]
    expected_culprit_ranks: list[int]
    culprit_nodes: list[str]
    culprit_ranks: list[int]
    expected_transient: bool | None
    transient: bool | None
    category_ok: bool | None
    action_ok: bool | None
    family_ok: bool | None
    culprit_ok: bool | None
    transient_ok: bool | None
    false_alarm: bool = False
    dangerous: list[str] = Field(default_factory=list)
    confidence: float
    rule_ids: list[str]
    evidence: Evidence | None = None


class HeadlineFigures(BaseModel):
    """The headline figures over a set of failure cases (all, or one evidence kind)."""

    n: int
    category_accuracy: float | None
    action_accuracy: float | None
    restart_family_accuracy: float | None
    stops_caught: int
    stops: int
    culprit_accuracy: float | None
    culprit_cases: int
    unknown_rate: float | None
    dangerous: int  # cases with a dangerous error


class EvalReport(BaseModel):
    """The figures of one directory; rates are None where no case is scored."""

    n: int
    failures: int  # cases labelled with a failure
    benign: int
    category_accuracy: float | None
    action_accuracy: float | None
    restart_family_accuracy: float | None  # action family (restart*/stop/wait/escalate) right
    binary_agreement: float | None  # STOP vs RESTART family, on cases labelled with either
    binary_cases: int
    stops_caught: int
    stops: int
    culprit_accuracy: float | None  # named node set == labelled set
    culprit_cases: int
    culprit_precision: float | None  # per node, over every failure case
    culprit_recall: float | None
    transient_accuracy: float | None
    transient_cases: int
    unknown_rate: float | None
    dangerous_stops: int
    dangerous: list[dict[str, str]]
    false_alarms: int
    false_alarm_files: list[str]
    # Per evidence kind ("excerpt", "thread"), over failure cases labelled with one.
    by_evidence: dict[str, HeadlineFigures]
    confusion: dict[str, dict[str, int]]  # expected category -> got -> count
    action_confusion: dict[str, dict[str, int]]
    unlabelled: list[str]  # case files in the directory that no label covers
    labels_files: list[str]
    results: list[CaseResult]


def label_files(directory: Path) -> list[Path]:
    """`labels.jsonl` and `labels.<part>.jsonl` in `directory`, in name order."""
    if not directory.is_dir():
        raise InputError(f"corpus directory {directory} does not exist")
    return sorted(
        p
        for p in directory.iterdir()
        if p.is_file() and (p.name == "labels.jsonl" or _is_part(p.name))
    )


def _is_part(name: str) -> bool:
    return name.startswith("labels.") and name.endswith(".jsonl") and name.count(".") == 2


def read_labels(paths: Sequence[Path]) -> list[Label]:
    """Every label of `paths`; a case labelled twice (in one file or across) is refused."""
    labels: list[Label] = []
    seen: dict[str, str] = {}
    for path in paths:
        if not path.is_file():
            raise InputError(f"labels file {path} does not exist")
        with open(path, encoding="utf-8", errors="replace") as handle:
            for number, raw in enumerate(handle, 1):
                if not raw.strip():
                    continue
                where = f"{path}:{number}"
                label = _parse(raw, where)
                if label.file in seen:
                    raise InputError(
                        f"{where}: case {label.file} is already labelled at {seen[label.file]}"
                        " (one label per case; with a merged labels.jsonl, remove the parts"
                        " or pass --labels)"
                    )
                seen[label.file] = where
                labels.append(label)
    return labels


def _parse(raw: str, where: str) -> Label:
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as error:
        raise InputError(
            f"{where}: malformed label: not JSON ({error.msg} at column {error.colno})"
        ) from error
    if not isinstance(data, dict):
        raise InputError(f"{where}: malformed label: not a JSON object")
    try:
        return Label.model_validate(data)
    except ValidationError as error:
        raise InputError(f"{where}: malformed label: {_short(error)}") from error


def _short(error: ValidationError) -> str:
    parts = []
    for item in error.errors()[:3]:
        where = ".".join(str(p) for p in item["loc"]) or "line"
        parts.append(f"{where}: {item['msg']}")
    return "; ".join(parts)


def case_paths(path: Path) -> list[str]:
    """A case is one log file, or a directory whose files are one incident's logs."""
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file())
        if not files:
            raise InputError(f"case directory {path} is empty")
    elif path.is_file():
        files = [path]
    else:
        raise InputError(f"{path}: no such file or directory")
    for file in files:
        if looks_binary(file):
            raise InputError(f"{file}: looks like a binary file, not a text log")
    return [str(f) for f in files]


def score(label: Label, diagnosis: Diagnosis) -> CaseResult:
    """How one diagnosis scores against its label."""
    # Labelled ranks are not turned into nodes: a rank's software fault (an illegal
    # address on rank 5) blames the rank, and its node stays innocent.
    # Hosts compare by short name, as the attributor reports them (gpu187.cluster.local
    # is gpu187).
    want_nodes = {short_host(n) for n in label.culprit_nodes}
    named = {short_host(n) for n in diagnosis.culprit_nodes}
    base: dict[str, Any] = {
        "file": label.file,
        "benign": label.benign,
        "expected_category": label.category.value if label.category else BENIGN,
        "category": diagnosis.category,
        "expected_action": label.expected_action.value if label.expected_action else BENIGN,
        "action": diagnosis.action,
        "expected_culprit_nodes": sorted(want_nodes),
        "expected_culprit_ranks": sorted(label.culprit_ranks),
        "culprit_nodes": sorted(named),
        "culprit_ranks": diagnosis.culprit_ranks,
        "expected_transient": label.transient,
        "transient": diagnosis.transient,
        "confidence": diagnosis.confidence,
        "rule_ids": diagnosis.rule_ids,
        "evidence": label.evidence,
    }
    if label.category is None or label.expected_action is None:
        # An operator would be paged or the job touched: anything but "nothing found".
        alarm = (
            diagnosis.category is not Category.UNKNOWN or diagnosis.action is not Action.ESCALATE
        )
        return CaseResult(
            **base,
            category_ok=None,
            action_ok=None,
            family_ok=None,
            culprit_ok=None,
            transient_ok=None,
            false_alarm=alarm,
        )
    # Each side the label gives (nodes, ranks) must be named exactly: a missing culprit
    # and an extra innocent one are both wrong.
    checks = []
    if want_nodes:
        checks.append(named == want_nodes)
    if label.culprit_ranks:
        checks.append(set(diagnosis.culprit_ranks) == set(label.culprit_ranks))
    culprit = all(checks) if checks else None
    return CaseResult(
        **base,
        category_ok=diagnosis.category is label.category,
        action_ok=diagnosis.action is label.expected_action,
        family_ok=family(diagnosis.action) == family(label.expected_action),
        culprit_ok=culprit,
        transient_ok=None if label.transient is None else diagnosis.transient is label.transient,
        dangerous=danger(label.expected_action, want_nodes, diagnosis),
    )


def danger(expected: Action, want_nodes: set[str], diagnosis: Diagnosis) -> list[str]:
    """Errors with a cost beyond a miss: a good job ended, an innocent node taken out,
    or a job restarted into the same failure."""
    found = []
    if diagnosis.action is Action.STOP and expected in _WOULD_RUN_AGAIN:
        found.append(f"stop where {expected.value} was right")
    if diagnosis.action in RESTART_FAMILY and expected is Action.STOP:
        found.append(f"{diagnosis.action.value} where stop was right")
    # Where the label names no culprit and isolating was right, the text cannot tell who
    # is innocent; anywhere else a node outside the labelled set is innocent.
    if diagnosis.action in ISOLATING and (want_nodes or expected not in ISOLATING):
        wrong = sorted({short_host(n) for n in diagnosis.culprit_nodes} - want_nodes)
        if wrong:
            verb = "drain" if diagnosis.action is Action.DRAIN_AND_RESTART else "exclusion"
            found.append(f"{verb} of non-culprit node(s) {', '.join(wrong)}")
    return found


def is_dangerous_stop(result: CaseResult) -> bool:
    return any(d.startswith("stop where") for d in result.dangerous)


def summarise(
    results: list[CaseResult],
    *,
    unlabelled: Iterable[str] = (),
    labels_files: Iterable[str] = (),
) -> EvalReport:
    """The figures over `results` (each a scored case)."""
    scored = [r for r in results if not r.benign]
    benign = [r for r in results if r.benign]
    binary = [
        r
        for r in scored
        if r.expected_action == Action.STOP.value or Action(r.expected_action) in RESTART_FAMILY
    ]
    with_transient = [r for r in scored if r.transient_ok is not None]
    tp = fp = fn = 0
    for r in scored:
        named, want = set(r.culprit_nodes), set(r.expected_culprit_nodes)
        tp += len(named & want)
        fp += len(named - want)
        fn += len(want - named)
    confusion: dict[str, Counter[str]] = {}
    actions: dict[str, Counter[str]] = {}
    for r in results:
        confusion.setdefault(r.expected_category, Counter())[r.category.value] += 1
        actions.setdefault(r.expected_action, Counter())[r.action.value] += 1
    headline = _headline(scored).model_dump(exclude={"n", "dangerous"})
    return EvalReport(
        n=len(results),
        failures=len(scored),
        benign=len(benign),
        **headline,
        binary_agreement=_rate(
            sum(_binary(r.action) == _binary_expected(r) for r in binary), len(binary)
        ),
        binary_cases=len(binary),
        culprit_precision=_rate(tp, tp + fp),
        culprit_recall=_rate(tp, tp + fn),
        transient_accuracy=_rate(
            sum(bool(r.transient_ok) for r in with_transient), len(with_transient)
        ),
        transient_cases=len(with_transient),
        dangerous_stops=sum(is_dangerous_stop(r) for r in scored),
        dangerous=[{"file": r.file, "why": why} for r in scored for why in r.dangerous],
        false_alarms=sum(r.false_alarm for r in benign),
        false_alarm_files=[r.file for r in benign if r.false_alarm],
        by_evidence=_by_evidence(scored),
        confusion=_table(confusion),
        action_confusion=_table(actions),
        unlabelled=sorted(unlabelled),
        labels_files=list(labels_files),
        results=results,
    )


def _by_evidence(scored: list[CaseResult]) -> dict[str, HeadlineFigures]:
    groups: dict[str, list[CaseResult]] = {}
    for r in scored:
        if r.evidence is not None:
            groups.setdefault(r.evidence, []).append(r)
    return {kind: _headline(cases) for kind, cases in sorted(groups.items())}


def _headline(cases: list[CaseResult]) -> HeadlineFigures:
    stops = [r for r in cases if r.expected_action == Action.STOP.value]
    with_culprit = [r for r in cases if r.culprit_ok is not None]
    return HeadlineFigures(
        n=len(cases),
        category_accuracy=_rate(sum(bool(r.category_ok) for r in cases), len(cases)),
        action_accuracy=_rate(sum(bool(r.action_ok) for r in cases), len(cases)),
        restart_family_accuracy=_rate(sum(bool(r.family_ok) for r in cases), len(cases)),
        stops_caught=sum(r.action is Action.STOP for r in stops),
        stops=len(stops),
        culprit_accuracy=_rate(sum(bool(r.culprit_ok) for r in with_culprit), len(with_culprit)),
        culprit_cases=len(with_culprit),
        unknown_rate=_rate(sum(r.category is Category.UNKNOWN for r in cases), len(cases)),
        dangerous=sum(bool(r.dangerous) for r in cases),
    )


def _binary(action: Action) -> str | None:
    if action is Action.STOP:
        return "stop"
    return "restart" if action in RESTART_FAMILY else None


def _binary_expected(result: CaseResult) -> str | None:
    return _binary(Action(result.expected_action))


def _rate(hits: int, total: int) -> float | None:
    return round(hits / total, 4) if total else None


def _table(rows: dict[str, Counter[str]]) -> dict[str, dict[str, int]]:
    return {k: dict(sorted(v.items())) for k, v in sorted(rows.items())}


def unlabelled_cases(directory: Path, labels: Sequence[Label]) -> list[str]:
    """Case files that no label covers, so that none is skipped silently.

    At the top level a case is a `*.log` file; inside a folder that holds labelled cases
    (the self-written corpus's `cases/`) every entry is a case.
    """
    covered = {Path(label.file) for label in labels}
    containers = {parent for path in covered for parent in path.parents if parent != Path()}
    missing = [p.name for p in directory.iterdir() if p.is_file() and p.suffix == ".log"]
    for folder in sorted(containers):
        if (directory / folder).is_dir():
            missing.extend(str(folder / p.name) for p in (directory / folder).iterdir())
    return sorted(m for m in missing if Path(m) not in covered and Path(m) not in containers)


def evaluate(
    directory: Path, labels_path: Path | None = None, attributor: Attributor | None = None
) -> EvalReport:
    """Attribute every labelled case of `directory` and score it.

    Labels come from `labels_path`, or else from every labels file of the directory; a
    directory without any is an empty report (n = 0), its unlabelled logs still listed.
    """
    if not directory.is_dir():
        raise InputError(f"corpus directory {directory} does not exist")
    paths = [labels_path] if labels_path is not None else label_files(directory)
    labels = read_labels(paths)
    engine = attributor or Attributor()
    results: list[CaseResult] = []
    for label in labels:
        files = case_paths(directory / label.file)
        try:
            nodelist = expand(label.nodelist) if label.nodelist else []
        except HostlistError as error:
            raise InputError(f"case {label.file}: nodelist: {error}") from error
        diagnosis = engine.attribute(
            AttributionRequest(
                nodelist=nodelist,
                tasks_per_node=label.tasks_per_node,
                node_addrs=label.node_addrs,
                log_paths=files,
                slurm=label.slurm,
            )
        )
        results.append(score(label, diagnosis))
    return summarise(
        results,
        unlabelled=unlabelled_cases(directory, labels),
        labels_files=[str(p) for p in paths],
    )


def misses(report: EvalReport) -> dict[str, list[str]]:
    """Per aspect, the cases that fail it: what a known-misses entry records."""
    return {
        aspect: sorted(r.file for r in report.results if getattr(r, f"{aspect}_ok") is False)
        for aspect in ASPECTS
    }


def known_miss_problems(report: EvalReport, known: dict[str, list[str]]) -> list[str]:
    """What breaks the known-misses contract: new misses (regressions), misses that now
    pass (the list must shrink), and entries naming no case or no aspect."""
    problems = []
    for aspect in sorted(set(known) - set(ASPECTS)):
        problems.append(f"unknown aspect {aspect!r} (known: {', '.join(ASPECTS)})")
    files = {r.file for r in report.results}
    now = misses(report)
    for aspect in ASPECTS:
        listed = set(known.get(aspect, []))
        for file in sorted(set(now[aspect]) - listed):
            problems.append(f"{file} fails {aspect} and is not a known miss (a regression?)")
        for file in sorted(listed - set(now[aspect])):
            if file in files:
                problems.append(f"{file} now passes {aspect}: remove it from the known misses")
            else:
                problems.append(f"{file} (listed under {aspect}) is not a labelled case")
    return problems


def read_known_misses(path: Path) -> dict[str, dict[str, list[str]]]:
    """split -> aspect -> files; a missing file is an empty list."""
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise InputError(f"{path}: not JSON ({error.msg} at line {error.lineno})") from error
    splits = data.get("splits") if isinstance(data, dict) else None
    if not isinstance(splits, dict) or not all(
        isinstance(aspects, dict)
        and all(
            isinstance(v, list) and all(isinstance(f, str) for f in v) for v in aspects.values()
        )
        for aspects in splits.values()
    ):
        raise InputError(f'{path}: expected {{"splits": {{split: {{aspect: [file, ...]}}}}}}')
    return splits


def write_known_misses(path: Path, split: str, report: EvalReport) -> dict[str, list[str]]:
    """Record `report`'s misses as `split`'s entry of `path`, keeping the other splits
    and any hand-kept aspect of this one (the accepted "dangerous" list of eval or tune: a person
    decides it, so a regeneration must not drop it silently)."""
    splits = read_known_misses(path)
    hand_kept = {k: v for k, v in splits.get(split, {}).items() if k not in ASPECTS}
    splits[split] = {**misses(report), **hand_kept}
    data = {
        "about": (
            "Cases each split fails today, per aspect. tests/unit/test_corpus_real.py fails"
            " on a miss not listed here and on a listed case that now passes. Regenerate one"
            " split with: trainmedic attribution eval DIR [--labels FILE]"
            " --write-known-misses tests/corpus/real/known_misses.json --split NAME"
        ),
        "splits": dict(sorted(splits.items())),
    }
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return splits[split]
