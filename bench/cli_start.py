"""CLI start-up: what `trainmedic` costs before its verb does anything.

The Slurm epilog runs `trainmedic report` at every job end on the controller host (within
a 2 s budget), and operators type `trainmedic --help`; neither should import the
Temporal client, the audit reader or the lab. In fresh interpreters, repeated:

- `import_ms`: `python -X importtime -c 'import trainmedic.cli.main'`, the cumulative
  time of trainmedic.cli.main as importtime reports it (`_p50`, `_min`);
- `help_s`, `report_help_s`, `version_s`: wall time of `trainmedic --help`,
  `trainmedic report --help` and `trainmedic --version` (the venv's entry point);
- `python_s`: `python -c pass`, the interpreter's own start, side by side;
- `heavy_imported`: which of temporalio, trainmedic.audit and trainmedic.lab the
  import pulled in (tests/unit/test_cli_imports.py fails on any).

Last line: one JSON object.

    .venv/bin/python bench/cli_start.py            # 20 runs each
    .venv/bin/python bench/cli_start.py --quick    # 5 runs each
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("temporalio", "trainmedic.audit", "trainmedic.lab")


def say(text: str) -> None:
    print(text, flush=True)


def entry_point() -> list[str]:
    script = Path(sys.executable).parent / "trainmedic"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "trainmedic.cli.main"]


def import_us() -> int:
    """Cumulative µs of trainmedic.cli.main in one fresh interpreter."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import trainmedic.cli.main"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    for line in done.stderr.splitlines():
        fields = [f.strip() for f in line.removeprefix("import time:").split("|")]
        if len(fields) == 3 and fields[2] == "trainmedic.cli.main":
            return int(fields[1])
    raise RuntimeError("importtime did not report trainmedic.cli.main")


def heavy_imported() -> list[str]:
    probe = (
        "import json, sys, trainmedic.cli.main; "
        f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT
    )
    found: list[str] = json.loads(done.stdout)
    return found


def wall_s(argv: list[str]) -> float:
    env = {**os.environ, "COLUMNS": "100"}
    start = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=ROOT)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="5 runs each, seconds")
    parser.add_argument("-n", type=int, default=None, help="runs each (default 20, quick 5)")
    args = parser.parse_args()
    n = args.n or (5 if args.quick else 20)
    started = time.monotonic()
    cli = entry_point()
    say(f"cli: {' '.join(cli)}; {n} runs each")

    imports = [import_us() for _ in range(n)]
    say(f"import trainmedic.cli.main: p50 {statistics.median(imports) / 1000:.1f} ms")
    timings: dict[str, list[float]] = {"python": [], "help": [], "report_help": [], "version": []}
    argvs = {
        "python": [sys.executable, "-c", "pass"],
        "help": [*cli, "--help"],
        "report_help": [*cli, "report", "--help"],
        "version": [*cli, "--version"],
    }
    for _ in range(n):  # interleaved, so a busy moment does not land on one figure only
        for name, argv in argvs.items():
            timings[name].append(wall_s(argv))
    for name, values in timings.items():
        say(f"{' '.join(argvs[name][len(cli) :]) or name}: p50 {statistics.median(values):.3f} s")

    result: dict[str, Any] = {
        "bench": "cli_start",
        "n": n,
        "quick": args.quick,
        "import_ms_p50": round(statistics.median(imports) / 1000, 1),
        "import_ms_min": round(min(imports) / 1000, 1),
        "heavy_imported": heavy_imported(),
    }
    for name, values in timings.items():
        result[f"{name}_s_p50"] = round(statistics.median(values), 3)
        result[f"{name}_s_max"] = round(max(values), 3)
    result["wall_s"] = round(time.monotonic() - started, 1)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
