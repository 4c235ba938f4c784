"""Lab faults: kernel line shapes vs the catalog, the one-shot request protocol, and the
fake trainer run as a plain process (Slurm's environment set by hand)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from trainmedic.catalog import Matcher, load_catalog
from trainmedic.lab import faults
from trainmedic.lab.faults import Fault


@pytest.fixture(scope="module")
def matcher() -> Matcher:
    return Matcher(load_catalog())


@pytest.mark.parametrize(
    ("fault", "rule", "category"),
    [
        (Fault.XID79, "kernel.xid_79", "gpu_hardware"),
        (Fault.ECC, "kernel.xid_48", "gpu_memory_ecc"),
        (Fault.HOST_OOM, "oom.host_kernel", "oom_host"),
    ],
)
def test_kernel_lines_match_the_catalog(
    matcher: Matcher, fault: Fault, rule: str, category: str
) -> None:
    lines = faults.kernel_lines(fault, pid=4242, node="gpu02", gpu=3)
    hits = {m.rule.id: m for line in lines for m in matcher.match(line)}
    assert rule in hits
    assert hits[rule].rule.category.value == category == faults.EXPECTED_CATEGORY[fault]
    if fault is not Fault.HOST_OOM:
        assert hits[rule].pci == faults.kernel_pci(3)


def test_non_kernel_faults_write_no_kernel_lines() -> None:
    for fault in set(Fault) - faults.KERNEL_FAULTS:
        assert faults.kernel_lines(fault, pid=1) == []


def test_pci_ids_are_distinct_and_agree() -> None:
    ids = [faults.pci_bus_id(i) for i in range(16)]
    assert len(set(ids)) == 16
    for i in range(16):
        assert faults.pci_bus_id(i).lower().endswith(faults.kernel_pci(i).split(":", 1)[1] + ".0")


def test_request_is_claimed_once(tmp_path: Path) -> None:
    faults.request_fault(tmp_path, "gpu01", Fault.ECC, "tok", None)
    assert faults.claim_fault(tmp_path, "gpu01", "7", "7.0") == {
        "fault": "ecc",
        "token": "tok",
        "job_id": None,
        "at": pytest.approx(0, abs=1e12),
    }
    assert faults.claim_fault(tmp_path, "gpu01", "7", "7.0") is None
    assert not faults.withdraw_fault(tmp_path, "gpu01", "tok")


def test_request_for_another_job_is_left_alone(tmp_path: Path) -> None:
    faults.request_fault(tmp_path, "gpu01", Fault.HANG, "tok", "12")
    assert faults.claim_fault(tmp_path, "gpu01", "7", "7.0") is None
    assert faults.withdraw_fault(tmp_path, "gpu01", "tok")
    assert faults.claim_fault(tmp_path, "gpu01", "12", "12.0") is None


def _run_trainer(
    tmp_path: Path, *, rank: int = 0, job: str = "5", restart: int = 0, steps: int = 6
) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "SLURM_PROCID": str(rank),
        "SLURM_NTASKS": "2",
        "SLURM_LOCALID": "0",
        "SLURM_JOB_ID": job,
        "SLURMD_NODENAME": f"gpu0{rank + 1}",
        "SLURM_RESTART_COUNT": str(restart),
    }
    argv = [
        sys.executable,
        "-m",
        "trainmedic.lab.trainer",
        "--steps",
        str(steps),
        "--step-seconds",
        "0.05",
        "--ckpt-every",
        "2",
        "--ckpt-dir",
        str(tmp_path / "ckpt"),
        "--lab-root",
        str(tmp_path),
        "--cascade-seconds",
        "0.1",
    ]
    return subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def test_trainer_progress_checkpoints_and_resume(tmp_path: Path) -> None:
    first = _run_trainer(tmp_path, steps=4)
    out, _ = first.communicate(timeout=60)
    assert first.returncode == 0, out
    assert "[rank0]: step 3/4 | loss " in out and " it/s" in out
    assert "[rank0]: saved checkpoint at step 4" in out
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["step-2", "step-4"]
    second = _run_trainer(tmp_path, restart=1, steps=6)
    out, _ = second.communicate(timeout=60)
    assert "[rank0]: resuming from checkpoint step 4" in out
    assert "step 4/6" not in out and "[rank0]: step 5/6" in out


def test_trainer_plays_a_user_exception_once(tmp_path: Path) -> None:
    faults.request_fault(tmp_path, "gpu01", Fault.USER_EXCEPTION, "tok", "5")
    proc = _run_trainer(tmp_path)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert "[rank0]: Traceback (most recent call last):" in out
    assert out.rstrip().endswith("[rank0]: KeyError: 'labels'")
    record = faults.find_record(tmp_path, "gpu01", "tok")
    assert record is not None and record["rank"] == 0 and record["job_id"] == "5"
    again = _run_trainer(tmp_path, restart=1)
    assert again.wait(timeout=60) == 0  # consumed: the next run is clean


def test_trainer_host_oom_writes_kernel_lines_and_dies_by_sigkill(tmp_path: Path) -> None:
    faults.request_fault(tmp_path, "gpu01", Fault.HOST_OOM, "tok", None)
    proc = _run_trainer(tmp_path)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    kern = (faults.node_dir(tmp_path, "gpu01") / faults.KERNEL_LOG).read_text()
    assert f"Out of memory: Killed process {proc.pid} (python)" in kern


def test_peer_of_a_failed_rank_times_out_like_nccl(tmp_path: Path) -> None:
    run_dir = tmp_path / "jobs" / "run-5-0"
    run_dir.mkdir(parents=True)
    (run_dir / "rank1.failed").write_text("1\n")
    proc = _run_trainer(tmp_path, rank=0)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGABRT
    assert "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=" in out
    assert "OpType=ALLREDUCE" in out and "milliseconds before timing out." in out
