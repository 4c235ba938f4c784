"""Score the Attributor against a labelled directory of cases (`attribution eval`)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from trainmedic.catalog.engine import Attributor
from trainmedic.catalog.scanner import looks_binary
from trainmedic.domain import Action, AttributionRequest, Category, Diagnosis, SlurmObservation
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
_RESTARTS = {Action.RESTART, Action.RESTART_EXCLUDING, Action.DRAIN_AND_RESTART}


class InputError(TrainmedicError):
    """A case, log or labels file that cannot be used; the message names it."""


class Label(BaseModel):
    model_config = ConfigDict(extra="ignore")

    file: str
    category: Category
    culprit: str | None = None
    transient: bool | None = None
    expected_action: Action
    nodelist: str | None = None
    tasks_per_node: int | None = Field(default=None, ge=1)
    slurm: SlurmObservation | None = None

    @field_validator("expected_action", mode="before")
    @classmethod
    def _alias(cls, value: Any) -> Any:
        if isinstance(value, str) and value in ACTION_ALIASES:
            return ACTION_ALIASES[value]
        return value


class CaseResult(BaseModel):
    file: str
    expected_category: Category
    category: Category
    expected_action: Action
    action: Action
    expected_culprit: str | None
    culprit_nodes: list[str]
    culprit_ranks: list[int]
    category_ok: bool
    action_ok: bool
    culprit_ok: bool
    dangerous: str | None = None
    confidence: float
    rule_ids: list[str]


class EvalReport(BaseModel):
    cases: int
    category_accuracy: float
    action_accuracy: float
    culprit_accuracy: float
    dangerous: list[dict[str, str]]
    confusion: dict[str, dict[str, int]]
    results: list[CaseResult]


def read_labels(path: Path) -> list[Label]:
    if not path.is_file():
        raise InputError(f"labels file {path} does not exist")
    labels: list[Label] = []
    with open(path, encoding="utf-8", errors="replace") as handle:
        for number, raw in enumerate(handle, 1):
            if not raw.strip():
                continue
            try:
                labels.append(Label.model_validate(json.loads(raw)))
            except (json.JSONDecodeError, ValidationError) as error:
                if isinstance(error, json.JSONDecodeError):
                    detail = f"not JSON ({error.msg} at column {error.colno})"
                else:
                    detail = _short(error)
                raise InputError(f"{path}:{number}: malformed label: {detail}") from error
    return labels


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


def culprit_ok(expected: str | None, diagnosis: Diagnosis) -> bool:
    if expected is None:
        return not diagnosis.culprit_nodes
    if expected.startswith("rank "):
        try:
            return int(expected.split()[1]) in diagnosis.culprit_ranks
        except (IndexError, ValueError):
            return False
    return expected in diagnosis.culprit_nodes


def danger(label: Label, diagnosis: Diagnosis) -> str | None:
    if diagnosis.action is Action.STOP and label.expected_action in _RESTARTS:
        return "stop where a restart was right"
    if diagnosis.action in (Action.DRAIN_AND_RESTART, Action.RESTART_EXCLUDING):
        wrong = [n for n in diagnosis.culprit_nodes if n != label.culprit]
        if wrong and diagnosis.action is Action.DRAIN_AND_RESTART:
            return f"drain of non-culprit node(s) {', '.join(wrong)}"
    return None


def evaluate(
    directory: Path, labels_path: Path, attributor: Attributor | None = None
) -> EvalReport:
    if not directory.is_dir():
        raise InputError(f"corpus directory {directory} does not exist")
    labels = read_labels(labels_path)
    if not labels:
        raise InputError(f"{labels_path}: no labelled cases")
    engine = attributor or Attributor()
    results: list[CaseResult] = []
    confusion: dict[str, Counter[str]] = {}
    for label in labels:
        paths = case_paths(directory / label.file)
        try:
            nodelist = expand(label.nodelist) if label.nodelist else []
        except HostlistError as error:
            raise InputError(f"{labels_path}: case {label.file}: {error}") from error
        diagnosis = engine.attribute(
            AttributionRequest(
                nodelist=nodelist,
                tasks_per_node=label.tasks_per_node,
                log_paths=paths,
                slurm=label.slurm,
            )
        )
        result = CaseResult(
            file=label.file,
            expected_category=label.category,
            category=diagnosis.category,
            expected_action=label.expected_action,
            action=diagnosis.action,
            expected_culprit=label.culprit,
            culprit_nodes=diagnosis.culprit_nodes,
            culprit_ranks=diagnosis.culprit_ranks,
            category_ok=diagnosis.category is label.category,
            action_ok=diagnosis.action is label.expected_action,
            culprit_ok=culprit_ok(label.culprit, diagnosis),
            dangerous=danger(label, diagnosis),
            confidence=diagnosis.confidence,
            rule_ids=diagnosis.rule_ids,
        )
        results.append(result)
        confusion.setdefault(label.category.value, Counter())[diagnosis.category.value] += 1
    n = len(results)
    return EvalReport(
        cases=n,
        category_accuracy=round(sum(r.category_ok for r in results) / n, 4),
        action_accuracy=round(sum(r.action_ok for r in results) / n, 4),
        culprit_accuracy=round(sum(r.culprit_ok for r in results) / n, 4),
        dangerous=[{"file": r.file, "why": r.dangerous} for r in results if r.dangerous],
        confusion={k: dict(v) for k, v in sorted(confusion.items())},
        results=results,
    )
