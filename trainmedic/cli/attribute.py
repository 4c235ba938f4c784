"""`trainmedic attribute PATH...` and `trainmedic attribution eval DIR --labels FILE`."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from trainmedic.catalog.engine import Attributor
from trainmedic.catalog.evaluation import InputError, case_paths, evaluate
from trainmedic.catalog.model import CatalogError
from trainmedic.domain import AttributionRequest, Diagnosis
from trainmedic.domain.hostlist import HostlistError, expand

attribution_app = typer.Typer(help="Measure the attribution engine on labelled cases.")


def _fail(message: str) -> typer.Exit:
    Console(stderr=True).print(f"[bold red]error:[/] {message}", highlight=False, markup=True)
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
    labels: Path = typer.Option(..., "--labels", help="JSON Lines labels file."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Run every labelled case; print accuracy, a confusion table and dangerous errors."""
    try:
        report = evaluate(directory, labels)
    except (InputError, CatalogError) as error:
        raise _fail(str(error)) from None
    if as_json:
        typer.echo(report.model_dump_json())
        return
    console = Console(width=max(160, Console().width))
    table = Table("case", "category", "action", "culprit", "ok", title="cases")
    for r in report.results:
        ok = "".join("✓" if x else "✗" for x in (r.category_ok, r.action_ok, r.culprit_ok))
        table.add_row(
            r.file,
            r.category.value
            if r.category_ok
            else f"{r.category.value} (want {r.expected_category.value})",
            r.action.value if r.action_ok else f"{r.action.value} (want {r.expected_action.value})",
            ",".join(r.culprit_nodes) or (f"ranks {r.culprit_ranks}" if r.culprit_ranks else "-"),
            ok,
        )
    console.print(table)
    confusion = Table(
        "expected \\ got", *sorted({g for row in report.confusion.values() for g in row})
    )
    columns = [c.header for c in confusion.columns[1:]]
    for expected, row in report.confusion.items():
        confusion.add_row(expected, *[str(row.get(str(c), "")) for c in columns])
    console.print(confusion)
    console.print(
        f"cases {report.cases}  category {report.category_accuracy:.1%}  action "
        f"{report.action_accuracy:.1%}  culprit {report.culprit_accuracy:.1%}",
        highlight=False,
    )
    if report.dangerous:
        console.print(f"[bold red]dangerous errors: {len(report.dangerous)}[/]")
        for item in report.dangerous:
            console.print(f"  {item['file']}: {item['why']}", highlight=False, markup=False)
    else:
        console.print("dangerous errors: 0")


def register(app: typer.Typer) -> None:
    """Add the attribution verbs to the root app."""
    app.command("attribute")(attribute)
    app.add_typer(attribution_app, name="attribution")
