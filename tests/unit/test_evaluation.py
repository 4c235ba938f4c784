"""The evaluation's figures on small hand-made labels and diagnoses, and its label loader."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from trainmedic.catalog.evaluation import (
    InputError,
    Label,
    evaluate,
    known_miss_problems,
    label_files,
    misses,
    read_known_misses,
    read_labels,
    score,
    summarise,
    write_known_misses,
)
from trainmedic.cli.attribute import register
from trainmedic.domain import Action, Category, Diagnosis


def _label(**kw: object) -> Label:
    data: dict[str, object] = {"file": "a.log", "category": "gpu_hardware"}
    data.setdefault("expected_action", "drain_and_restart")
    data.update(kw)
    return Label.model_validate(data)


def _dx(category: Category, action: Action, **kw: object) -> Diagnosis:
    return Diagnosis(category=category, action=action, confidence=0.9, catalog_version="t", **kw)  # type: ignore[arg-type]


def test_extra_innocent_node_is_a_culprit_error_and_lowers_precision() -> None:
    label = _label(culprit_nodes=["gpu03"])
    dx = _dx(Category.GPU_HARDWARE, Action.DRAIN_AND_RESTART, culprit_nodes=["gpu03", "gpu01"])
    result = score(label, dx)
    assert result.culprit_ok is False
    assert result.dangerous == ["drain of non-culprit node(s) gpu01"]
    report = summarise([result])
    assert (report.culprit_precision, report.culprit_recall) == (0.5, 1.0)
    assert report.culprit_accuracy == 0.0 and report.culprit_cases == 1


def test_precision_and_recall_are_per_node_over_cases() -> None:
    right = score(
        _label(file="a", culprit_nodes=["n1"]),
        _dx(Category.GPU_HARDWARE, Action.DRAIN_AND_RESTART, culprit_nodes=["n1"]),
    )
    missed = score(
        _label(file="b", culprit_nodes=["n2", "n3"]),
        _dx(Category.GPU_HARDWARE, Action.DRAIN_AND_RESTART, culprit_nodes=["n2"]),
    )
    # The label names nobody, the attributor names a node: an innocent one.
    extra = score(
        _label(file="c", category="network_nccl", expected_action="restart"),
        _dx(Category.NETWORK_NCCL, Action.RESTART, culprit_nodes=["n9"]),
    )
    report = summarise([right, missed, extra])
    assert report.culprit_precision == round(2 / 3, 4)  # n9 is innocent
    assert report.culprit_recall == round(2 / 3, 4)  # n3 missed
    assert report.culprit_accuracy == 0.5 and report.culprit_cases == 2
    assert extra.culprit_ok is None and extra.dangerous == []


def test_hosts_compare_by_short_name_and_ranks_are_scored_when_labelled() -> None:
    label = _label(culprit_nodes=["gpu187.cluster.local"], culprit_ranks=[4])
    assert (
        score(
            label,
            _dx(
                Category.GPU_HARDWARE,
                Action.DRAIN_AND_RESTART,
                culprit_nodes=["gpu187"],
                culprit_ranks=[4],
            ),
        ).culprit_ok
        is True
    )
    no_rank = _dx(Category.GPU_HARDWARE, Action.DRAIN_AND_RESTART, culprit_nodes=["gpu187"])
    assert score(label, no_rank).culprit_ok is False


def test_legacy_single_culprit_loads_as_node_or_rank() -> None:
    node = _label(culprit="gpu03")
    rank = _label(culprit="rank 5", expected_action="restart_excluding_node")
    none = _label(culprit=None, expected_action="escalate_to_human")
    assert (node.culprit_nodes, node.culprit_ranks) == (["gpu03"], [])
    assert (rank.culprit_nodes, rank.culprit_ranks) == ([], [5])
    assert rank.expected_action is Action.RESTART_EXCLUDING
    assert none.expected_action is Action.ESCALATE and not none.culprit_nodes
    with pytest.raises(ValueError, match="either culprit or culprit_nodes"):
        _label(culprit="gpu03", culprit_nodes=["gpu03"])


def test_dangerous_stop_and_restart_where_stop_was_right() -> None:
    stop = score(
        _label(category="network_nccl", expected_action="restart"),
        _dx(Category.USER_CODE, Action.STOP),
    )
    restart = score(
        _label(category="user_code", expected_action="stop"),
        _dx(Category.NETWORK_NCCL, Action.RESTART),
    )
    escalate = score(
        _label(category="user_code", expected_action="stop"),
        _dx(Category.UNKNOWN, Action.ESCALATE),
    )
    # Stopping a job its scheduler would requeue ends a job that would have run again.
    preempted = score(
        _label(category="scheduler_preemption", expected_action="wait"),
        _dx(Category.USER_CODE, Action.STOP),
    )
    assert stop.dangerous == ["stop where restart was right"]
    assert restart.dangerous == ["restart where stop was right"]
    assert escalate.dangerous == [] and preempted.dangerous == ["stop where wait was right"]
    report = summarise([stop, restart, escalate, preempted])
    assert report.dangerous_stops == 2 and len(report.dangerous) == 3
    assert (report.stops_caught, report.stops) == (0, 2)
    # Labelled stop or restart family: stop, restart, escalate (not wait).
    assert report.binary_cases == 3 and report.binary_agreement == 0.0
    assert report.unknown_rate == 0.25


def test_drain_without_labelled_culprit_is_dangerous_only_where_no_isolation_was_right() -> None:
    dx = _dx(Category.GPU_HARDWARE, Action.DRAIN_AND_RESTART, culprit_nodes=["n1"])
    assert score(_label(), dx).dangerous == []
    wrong = score(_label(category="network_nccl", expected_action="restart"), dx)
    assert wrong.dangerous == ["drain of non-culprit node(s) n1"]
    excluded = _dx(Category.NETWORK_NCCL, Action.RESTART_EXCLUDING, culprit_nodes=["n1", "n2"])
    labelled = _label(expected_action="restart_excluding", culprit_nodes=["n2"])
    assert score(labelled, excluded).dangerous == ["exclusion of non-culprit node(s) n1"]


def test_action_family_and_exact_action() -> None:
    result = score(_label(), _dx(Category.GPU_HARDWARE, Action.RESTART_EXCLUDING))
    assert (result.action_ok, result.family_ok) == (False, True)
    report = summarise([result])
    assert (report.action_accuracy, report.restart_family_accuracy) == (0.0, 1.0)
    assert report.binary_agreement == 1.0


def test_transient_is_scored_only_where_labelled() -> None:
    dx = _dx(Category.GPU_HARDWARE, Action.DRAIN_AND_RESTART, transient=False)
    unsure = _dx(Category.GPU_HARDWARE, Action.DRAIN_AND_RESTART)
    results = [
        score(_label(file="a", transient=False), dx),
        score(_label(file="b", transient=True), dx),
        score(_label(file="c", transient=False), unsure),  # no answer is a wrong answer
        score(_label(file="d", transient=None), dx),
    ]
    assert [r.transient_ok for r in results] == [True, False, False, None]
    report = summarise(results)
    assert report.transient_cases == 3 and report.transient_accuracy == round(1 / 3, 4)
    assert misses(report)["transient"] == ["b", "c"]


def test_benign_false_alarm_is_any_diagnosis_but_nothing_found() -> None:
    benign = _label(category="none", expected_action="none")
    assert benign.benign
    quiet = score(benign, _dx(Category.UNKNOWN, Action.ESCALATE))
    alarm = score(
        benign.model_copy(update={"file": "b.log"}), _dx(Category.NETWORK_NCCL, Action.RESTART)
    )
    assert not quiet.false_alarm and alarm.false_alarm
    report = summarise([quiet, alarm])
    assert (report.false_alarms, report.false_alarm_files, report.benign) == (1, ["b.log"], 2)
    # Benign cases are not failures: no accuracy, no unknown rate, no known misses.
    assert report.failures == 0 and report.category_accuracy is None
    assert report.unknown_rate is None and all(v == [] for v in misses(report).values())


def test_benign_label_must_be_benign_on_both_sides() -> None:
    with pytest.raises(ValueError, match='category "none" and expected_action "none"'):
        _label(category="none", expected_action="restart")
    with pytest.raises(ValueError, match="names no culprit"):
        _label(category="none", expected_action="none", culprit_nodes=["n1"])


def test_figures_per_evidence_kind_split_the_failure_cases() -> None:
    results = [
        # Evidence in the excerpt: one right, one a dangerous stop.
        score(_label(file="a", evidence="excerpt"), _good()),
        score(
            _label(file="b", evidence="excerpt", expected_action="restart"),
            _dx(Category.GPU_HARDWARE, Action.STOP),
        ),
        # Only the thread knows: missed as unknown.
        score(
            _label(file="c", evidence="thread", category="oom_host", expected_action="stop"),
            _dx(Category.UNKNOWN, Action.ESCALATE),
        ),
        # Not judged, and a benign case: in no group.
        score(_label(file="d"), _good()),
        score(_label(file="e", category="none", expected_action="none"), _good()),
    ]
    report = summarise(results)
    assert set(report.by_evidence) == {"excerpt", "thread"}
    excerpt, thread = report.by_evidence["excerpt"], report.by_evidence["thread"]
    assert (excerpt.n, excerpt.category_accuracy, excerpt.action_accuracy) == (2, 1.0, 0.5)
    assert (excerpt.dangerous, excerpt.stops, excerpt.unknown_rate) == (1, 0, 0.0)
    assert (thread.n, thread.category_accuracy, thread.unknown_rate) == (1, 0.0, 1.0)
    assert (thread.stops_caught, thread.stops, thread.dangerous) == (0, 1, 0)
    # The whole report still counts every failure case.
    assert report.failures == 4 and report.category_accuracy == 0.75
    assert summarise([results[3]]).by_evidence == {}


def _write(path: Path, *lines: object) -> Path:
    path.write_text(
        "".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines),
        encoding="utf-8",
    )
    return path


CASE = {"file": "a.log", "category": "unknown", "expected_action": "escalate"}


def test_labels_parts_are_read_together_and_duplicates_refused(tmp_path: Path) -> None:
    _write(tmp_path / "labels.a.jsonl", CASE)
    _write(tmp_path / "labels.b.jsonl", {**CASE, "file": "b.log"}, {**CASE, "file": "a.log"})
    (tmp_path / "labels.a.jsonl.bak").write_text("")
    assert [p.name for p in label_files(tmp_path)] == ["labels.a.jsonl", "labels.b.jsonl"]
    with pytest.raises(InputError) as error:
        read_labels(label_files(tmp_path))
    message = str(error.value)
    assert "labels.b.jsonl:2" in message and "labels.a.jsonl:1" in message
    assert "a.log is already labelled" in message


@pytest.mark.parametrize(
    ("line", "detail"),
    [
        ("{bad", "not JSON"),
        ("[1, 2]", "not a JSON object"),
        (json.dumps({**CASE, "category": "gpu_broken"}), "category"),
        (json.dumps({**CASE, "culprit_node": ["n1"]}), "culprit_node"),
        (json.dumps({"category": "unknown", "expected_action": "escalate"}), "file"),
        (json.dumps({**CASE, "transient": "maybe"}), "transient"),
        (json.dumps({**CASE, "file": "../../etc/passwd"}), "inside the corpus directory"),
        (json.dumps({**CASE, "evidence": "issue"}), "evidence"),
    ],
)
def test_malformed_label_names_file_and_line(tmp_path: Path, line: str, detail: str) -> None:
    path = _write(tmp_path / "labels.jsonl", CASE, "", line)
    with pytest.raises(InputError, match=rf"labels\.jsonl:3: malformed label: .*{detail}"):
        read_labels([path])


def test_evaluate_empty_directory_is_an_empty_report(tmp_path: Path) -> None:
    report = evaluate(tmp_path)
    assert report.n == 0 and report.labels_files == [] and report.unlabelled == []
    assert report.category_accuracy is None and report.dangerous == []
    (tmp_path / "x.log").write_text("hello\n")
    assert evaluate(tmp_path).unlabelled == ["x.log"]


def test_evaluate_lists_unlabelled_cases_and_refuses_missing_ones(tmp_path: Path) -> None:
    (tmp_path / "cases").mkdir()
    (tmp_path / "cases" / "a.log").write_text("iteration 1 | loss 2.0\n")
    (tmp_path / "cases" / "b.log").write_text("iteration 1 | loss 2.0\n")
    (tmp_path / "c.log").write_text("iteration 1 | loss 2.0\n")
    _write(tmp_path / "labels.jsonl", {**CASE, "file": "cases/a.log"})
    report = evaluate(tmp_path)
    assert report.n == 1 and report.results[0].category_ok is True
    assert report.unlabelled == ["c.log", "cases/b.log"]
    _write(tmp_path / "labels.jsonl", {**CASE, "file": "gone.log"})
    with pytest.raises(InputError, match=r"gone\.log"):
        evaluate(tmp_path)


def test_known_misses_round_trip_and_contract(tmp_path: Path) -> None:
    results = [
        score(_label(file="a"), _dx(Category.GPU_HARDWARE, Action.DRAIN_AND_RESTART)),
        score(_label(file="b"), _dx(Category.UNKNOWN, Action.ESCALATE)),
    ]
    report = summarise(results)
    path = tmp_path / "known.json"
    write_known_misses(path, "tune", report)
    write_known_misses(path, "eval", summarise([]))
    known = read_known_misses(path)
    assert set(known) == {"tune", "eval"}
    assert known["tune"]["category"] == ["b"] and known["tune"]["action"] == ["b"]
    assert known_miss_problems(report, known["tune"]) == []
    fixed = summarise([results[0]])
    assert known_miss_problems(fixed, known["tune"]) == [
        "b (listed under category) is not a labelled case",
        "b (listed under action) is not a labelled case",
    ]
    better = summarise([results[0], score(_label(file="b"), _good())])
    problems = known_miss_problems(better, known["tune"])
    assert "b now passes category: remove it from the known misses" in problems
    worse = known_miss_problems(report, {"category": [], "actoin": []})
    assert "b fails category and is not a known miss (a regression?)" in worse
    assert any("unknown aspect 'actoin'" in p for p in worse)


def _good() -> Diagnosis:
    return _dx(Category.GPU_HARDWARE, Action.DRAIN_AND_RESTART)


def test_known_misses_file_shape_is_checked(tmp_path: Path) -> None:
    path = tmp_path / "known.json"
    assert read_known_misses(path) == {}
    path.write_text('{"splits": {"tune": {"category": "a.log"}}}')
    with pytest.raises(InputError, match=r"known\.json"):
        read_known_misses(path)


def _app() -> typer.Typer:
    app = typer.Typer()
    register(app)

    @app.callback()
    def _root() -> None:
        pass

    return app


def test_cli_eval_defaults_to_the_directory_labels_and_writes_known_misses(
    tmp_path: Path,
) -> None:
    (tmp_path / "a.log").write_text("iteration 1 | loss 2.0\n")
    (tmp_path / "b.log").write_text("iteration 1 | loss 2.0\n")
    _write(tmp_path / "labels.a.jsonl", CASE)
    _write(tmp_path / "labels.b.jsonl", {**CASE, "file": "b.log", "category": "oom_gpu"})
    known = tmp_path / "known.json"
    result = CliRunner().invoke(
        _app(), ["attribution", "eval", str(tmp_path), "--write-known-misses", str(known)]
    )
    assert result.exit_code == 0, result.output
    assert "n 2 (failures 2, benign 0)" in result.output and "false alarms: 0" in result.output
    assert read_known_misses(known)[tmp_path.name]["category"] == ["b.log"]
    only_a = str(tmp_path / "labels.a.jsonl")
    as_json = CliRunner().invoke(
        _app(), ["attribution", "eval", str(tmp_path), "--labels", only_a, "--json"]
    )
    assert as_json.exit_code == 0, as_json.output
    data = json.loads(as_json.stdout)
    assert data["n"] == 1 and data["unlabelled"] == ["b.log"]
    _write(tmp_path / "labels.b.jsonl", {**CASE, "file": "b.log", "evidence": "thread"})
    text = CliRunner().invoke(_app(), ["attribution", "eval", str(tmp_path)])
    assert "evidence in the thread: 1 cases: category 100.0%" in text.output
    assert "evidence in the excerpt" not in text.output


def test_cli_eval_without_labels_is_a_clean_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(_app(), ["attribution", "eval", str(tmp_path)])
    assert result.exit_code == 2 and "no labels files" in result.output
    assert "Traceback" not in result.output


def test_regenerating_a_split_keeps_its_hand_kept_dangerous_list(tmp_path: Path) -> None:
    path = tmp_path / "known.json"
    path.write_text(
        json.dumps({"splits": {"eval": {"category": ["old"], "dangerous": ["x.log"]}}}),
        encoding="utf-8",
    )
    write_known_misses(path, "eval", summarise([]))
    known = read_known_misses(path)["eval"]
    # The scored aspects are rewritten from the report; the person's list stays.
    assert known["category"] == [] and known["dangerous"] == ["x.log"]
