"""Round 28 (other LLM frameworks, training outside language models, GPU node faults on
Kubernetes stacks, elastic launchers), and the documented words written before its cases
arrived: PaddlePaddle's launchers and signal handler, the Kubernetes device plugin's Xid
health check, the NVIDIA container runtime's refusals, Ray Train's summary.

Lines quoted from a tune case name it; the others follow the tools' own formats.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.attribution_support import diagnose
from trainmedic.domain import Action, Category


@pytest.mark.parametrize(
    ("line", "rank"),
    [
        (
            "LAUNCH ERROR 2023-05-10 12:00:00,000 ABORT!!! Out of all 4 trainers, the trainer "
            "process with rank=[2] was aborted. Please check its log.",
            2,
        ),
        (
            "Container rank 6 status failed cmd ['/usr/bin/python', '-u', 'train.py'] code 1 "
            "log log/default.fxemxd.6.log",
            6,
        ),
    ],
)
def test_paddles_launchers_name_the_trainer_that_failed(
    tmp_path: Path, line: str, rank: int
) -> None:
    diagnosis = diagnose(tmp_path, [line])
    assert diagnosis.rule_ids == ["torchelastic.child_failed"]
    assert (diagnosis.category, diagnosis.action) == (Category.UNKNOWN, Action.ESCALATE)
    assert diagnosis.culprit_ranks == [rank]


def test_paddles_launcher_names_no_one_when_several_trainers_died(tmp_path: Path) -> None:
    line = (
        "LAUNCH ERROR 2023-05-10 12:00:00,000 ABORT!!! Out of all 8 trainers, the trainer "
        "process with rank=[2,3] was aborted. Please check its log."
    )
    diagnosis = diagnose(tmp_path, [line])
    assert diagnosis.rule_ids == ["torchelastic.child_failed"]
    assert diagnosis.culprit_ranks == []


def test_the_trainers_own_error_decides_over_paddles_launcher(tmp_path: Path) -> None:
    diagnosis = diagnose(
        tmp_path,
        [
            "MemoryError: (ResourceExhausted) Out of memory error on GPU 0. Cannot allocate "
            "1.0GB memory on GPU 0, 79.1GB memory has been allocated and available memory is "
            "only 10.0MB.",
            "LAUNCH INFO 2022-07-21 11:58:59,451 Pod failed",
            "LAUNCH ERROR 2022-07-21 11:58:59,452 Container failed !!!",
            "Container rank 0 status failed cmd ['/usr/bin/python', '-u', 'train.py'] code 1 "
            "log log/workerlog.0",
        ],
    )
    assert (diagnosis.category, diagnosis.action) == (Category.OOM_GPU, Action.STOP)


@pytest.mark.parametrize(
    ("signal", "rule", "category"),
    [
        ("Segmentation fault", "proc.segfault", Category.CUDA_SOFTWARE),
        ("Erroneous arithmetic operation", "proc.native_crash", Category.CUDA_SOFTWARE),
        ("Bus error", "proc.bus_error", Category.DATA_LOADER),
        ("Process abort signal", "proc.abort", Category.UNKNOWN),
    ],
)
def test_paddles_signal_handler_names_the_signal(
    tmp_path: Path, signal: str, rule: str, category: Category
) -> None:
    diagnosis = diagnose(tmp_path, [f"FatalError: `{signal}` is detected by the operating system."])
    assert diagnosis.rule_ids == [rule]
    assert diagnosis.category == category


def test_paddles_termination_signal_is_a_teardown_not_the_programs_exception(
    tmp_path: Path,
) -> None:
    # SIGTERM is what a launcher or Slurm sends the survivors; it is not a Python
    # exception of the program's (python.exception_other read the class name before).
    diagnosis = diagnose(
        tmp_path, ["FatalError: `Termination signal` is detected by the operating system."]
    )
    assert diagnosis.category == Category.UNKNOWN
    assert "python.exception_other" not in diagnosis.rule_ids


def test_ray_trains_summary_is_not_the_programs_exception(tmp_path: Path) -> None:
    # tune/g-355.log: the summary asks to read the errors before it.
    diagnosis = diagnose(
        tmp_path,
        [
            "ray.train.base_trainer.TrainingFailedError: The Ray Train run failed. Please "
            "inspect the previous error messages for a cause."
        ],
    )
    assert diagnosis.category == Category.UNKNOWN
    assert diagnosis.action == Action.ESCALATE


@pytest.mark.parametrize(
    ("xid", "category"),
    [(79, Category.GPU_HARDWARE), (48, Category.GPU_MEMORY_ECC)],
)
def test_the_kubernetes_device_plugins_xid_health_check(
    tmp_path: Path, xid: int, category: Category
) -> None:
    line = (
        f"I0312 10:01:22.118000 1 health.go:120] XidCriticalError: Xid={xid} on "
        "Device=GPU-1a2b3c4d-0000-1111-2222-333344445555; marking device as unhealthy."
    )
    diagnosis = diagnose(tmp_path, [line])
    assert diagnosis.rule_ids == [f"kernel.xid_{xid}"]
    assert (diagnosis.category, diagnosis.action) == (category, Action.DRAIN_AND_RESTART)


def test_an_xid_number_without_its_word_is_not_read(tmp_path: Path) -> None:
    diagnosis = diagnose(tmp_path, ["step 79 | loss 2.31 | Xidx=79"])
    assert diagnosis.category == Category.UNKNOWN
    assert diagnosis.rule_ids == []


def test_the_container_runtimes_driver_mismatch(tmp_path: Path) -> None:
    line = (
        "nvidia-container-cli: initialization error: nvml error: driver/library version "
        "mismatch: unknown"
    )
    diagnosis = diagnose(tmp_path, [line])
    assert diagnosis.rule_ids == ["cuda.driver_mismatch"]
    assert diagnosis.action == Action.ESCALATE


def test_the_container_runtime_finding_no_driver_is_the_nodes(tmp_path: Path) -> None:
    line = (
        "stderr: Auto-detected mode as 'legacy' nvidia-container-cli: initialization error: "
        "nvml error: driver not loaded: unknown"
    )
    diagnosis = diagnose(tmp_path, [line])
    assert diagnosis.rule_ids == ["cuda.no_device"]
    assert diagnosis.category == Category.GPU_HARDWARE
