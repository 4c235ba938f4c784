"""`trainmedic attribute PATH...` and `trainmedic attribution eval DIR [--labels FILE]`."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from trainmedic.catalog.engine import Attributor
from trainmedic.catalog.evaluation import (
    EvalReport,
    InputError,
    case_paths,
    evaluate,
    label_files,
)
from trainmedic.catalog.evaluation import write_known_misses as write_known_misses_file
from trainmedic.catalog.model import CatalogError
from trainmedic.domain import AttributionRequest, Diagnosis
from trainmedic.domain.hostlist import HostlistError, expand

attribution_app = typer.Typer(help="Measure the attribution engine on labelled cases.")


def _fail(message: str) -> typer.Exit:
    Console(stderr=True).print(
        f"[bold red]error:[/] {message}", highlight=False, markup=True, soft_wrap=True
    )
    return typer.Exit(2)


def _as_json(file: str, diagnosis: Diagnosis) -> dict[str, object]:
    data = diagnosis.model_dump(mode="json")
    return {"file": file, **data}


def _print(console: Console, file: str, diagnosis: Diagnosis) -> None:
    console.print(f"[bold]{file}[/]", highlight=False)
    console.print(
        f"  {diagnosis.category.value} -> [bold]{diagnosis.action.value}[/]"
        f"  confidence {diagnosis.confidence:.2f}  transient {diagnosis.transient}",
        highlight=False,
    )
    if diagnosis.culprit_nodes or diagnosis.culprit_ranks:
        console.print(
            f"  culprit nodes {diagnosis.culprit_nodes or '-'}  ranks "
            f"{diagnosis.culprit_ranks or '-'}  gpus {diagnosis.culprit_gpus or '-'}",
            highlight=False,
        )
    console.print(f"  {diagnosis.summary}", highlight=False, markup=False)
    for ev in diagnosis.evidence:
        where = f"{ev.file}:{ev.line_no}" if ev.file else ev.source.value
        console.print(f"    [{ev.rule_id}] {where}: {ev.text[:200]}", highlight=False, markup=False)


def attribute(
    paths: list[Path] = typer.Argument(..., help="Log files (a directory = one incident)."),
    nodelist: str = typer.Option("", "--nodelist", help="The job's nodes, e.g. gpu[01-04]."),
    tasks_per_node: int | None = typer.Option(None, "--tasks-per-node", min=1),
    combine: bool = typer.Option(False, "--combine", help="All paths are one incident."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per input."),
) -> None:
    """Diagnose failure logs: category, action, culprit and the evidence lines."""
    try:
        nodes = expand(nodelist) if nodelist else []
        engine = Attributor()
        groups = (
            [(", ".join(str(p) for p in paths), [f for p in paths for f in case_paths(p)])]
            if combine
            else [(str(p), case_paths(p)) for p in paths]
        )
    except (InputError, HostlistError, CatalogError) as error:
        raise _fail(str(error)) from None
    console = Console()
    for name, files in groups:
        diagnosis = engine.attribute(
            AttributionRequest(nodelist=nodes, tasks_per_node=tasks_per_node, log_paths=files)
        )
        if as_json:
            typer.echo(json.dumps(_as_json(name, diagnosis)))
        else:
            _print(console, name, diagnosis)


@attribution_app.command("eval")
def eval_command(
    directory: Path = typer.Argument(..., help="Directory of cases."),
    labels: Path | None = typer.Option(
        None,
        "--labels",
        help="JSON Lines labels file [default: labels.jsonl and labels.*.jsonl in DIRECTORY].",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the report as one JSON object."),
    write_known_misses: Path | None = typer.Option(
        None,
        "--write-known-misses",
        help="Record today's misses as this directory's entry of a known-misses file.",
    ),
    split: str | None = typer.Option(
        None, "--split", help="Entry name for --write-known-misses [default: DIRECTORY's name]."
    ),
) -> None:
    """Run every labelled case; print the figures, confusion tables and dangerous errors."""
    try:
        if labels is None and not label_files(directory):
            raise InputError(
                f"no labels files (labels.jsonl, labels.*.jsonl) in {directory}; pass --labels"
            )
        report = evaluate(directory, labels)
        if write_known_misses is not None:
            name = split or directory.resolve().name
            written = write_known_misses_file(write_known_misses, name, report)
    except (InputError, CatalogError) as error:
        raise _fail(str(error)) from None
    if as_json:
        typer.echo(report.model_dump_json())
    else:
        _print_report(report)
    if write_known_misses is not None:
        counts = ", ".join(f"{aspect} {len(files)}" for aspect, files in written.items())
        Console(stderr=True).print(
            f"wrote split {name!r} to {write_known_misses}: {counts}",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _print_report(report: EvalReport) -> None:
    console = Console(width=max(160, Console().width))
    if report.results:
        table = Table("case", "category", "action", "culprit", "transient", "ok", title="cases")
        for r in report.results:
            marks = (r.category_ok, r.action_ok, r.culprit_ok, r.transient_ok)
            ok = "".join("·" if x is None else "✓" if x else "✗" for x in marks)
            if r.benign:
                ok = "false alarm" if r.false_alarm else "✓"
            named = ",".join(r.culprit_nodes) or (
                f"ranks {r.culprit_ranks}" if r.culprit_ranks else "-"
            )
            want = ",".join(r.expected_culprit_nodes) or (
                f"ranks {r.expected_culprit_ranks}" if r.expected_culprit_ranks else ""
            )
            table.add_row(
                r.file,
                _cell(r.category.value, r.expected_category, r.category_ok),
                _cell(r.action.value, r.expected_action, r.action_ok),
                _cell(named, want or "-", r.culprit_ok),
                _cell(str(r.transient), str(r.expected_transient), r.transient_ok),
                ok,
            )
        console.print(table)
        for title, rows in (
            ("categories", report.confusion),
            ("actions", report.action_confusion),
        ):
            console.print(_confusion(title, rows))
    console.print(
        f"n {report.n} (failures {report.failures}, benign {report.benign})\n"
        f"category {_pct(report.category_accuracy)}  action {_pct(report.action_accuracy)}"
        f"  restart family {_pct(report.restart_family_accuracy)}"
        f"  binary agreement {_pct(report.binary_agreement)} of {report.binary_cases}"
        f"  stops caught {report.stops_caught}/{report.stops}\n"
        f"culprit {_pct(report.culprit_accuracy)} of {report.culprit_cases}"
        f"  precision {_pct(report.culprit_precision)}  recall {_pct(report.culprit_recall)}"
        f"  transient {_pct(report.transient_accuracy)} of {report.transient_cases}"
        f"  unknown {_pct(report.unknown_rate)}",
        highlight=False,
        markup=False,
    )
    for kind, part in report.by_evidence.items():
        # Where the labels say whether the log itself shows the answer, the figures on
        # each side tell a rule gap (evidence in the excerpt) from what no log reader sees.
        console.print(
            f"evidence in the {kind}: {part.n} cases: category {_pct(part.category_accuracy)}"
            f"  action {_pct(part.action_accuracy)}"
            f"  restart family {_pct(part.restart_family_accuracy)}"
            f"  stops caught {part.stops_caught}/{part.stops}"
            f"  culprit {_pct(part.culprit_accuracy)} of {part.culprit_cases}"
            f"  unknown {_pct(part.unknown_rate)}  dangerous {part.dangerous}",
            highlight=False,
            markup=False,
        )
    _print_list(
        console,
        f"dangerous errors: {len(report.dangerous)} (dangerous stops {report.dangerous_stops})",
        [f"{d['file']}: {d['why']}" for d in report.dangerous],
    )
    _print_list(console, f"false alarms: {report.false_alarms}", report.false_alarm_files)
    if report.unlabelled:
        _print_list(console, f"unlabelled cases: {len(report.unlabelled)}", report.unlabelled)


def _cell(got: str, want: str, ok: bool | None) -> str:
    return got if ok is not False else f"{got} (want {want})"


def _confusion(title: str, rows: dict[str, dict[str, int]]) -> Table:
    # One row per expected value, the wrong answers spelled out: a full matrix of 16
    # categories does not fit a terminal.
    table = Table("expected", "right", "got instead", title=f"confusion: {title}")
    for expected, row in rows.items():
        total = sum(row.values())
        wrong = sorted(((n, got) for got, n in row.items() if got != expected), reverse=True)
        table.add_row(
            expected,
            f"{row.get(expected, 0)}/{total}",
            ", ".join(f"{got} {n}" for n, got in wrong) or "-",
        )
    return table


def _print_list(console: Console, headline: str, items: list[str]) -> None:
    style = "bold red" if items else "bold"
    console.print(headline, style=style, highlight=False, markup=False)
    for item in items:
        console.print(f"  {item}", highlight=False, markup=False)


def register(app: typer.Typer) -> None:
    """Add the attribution verbs to the root app."""
    app.command("attribute")(attribute)
    app.add_typer(attribution_app, name="attribution")
