"""The lab's fault catalogue: what each injectable fault prints, where, and how it exits.

Shared by `trainmedic lab inject` (which asks for a fault) and the fake trainer (which
plays it out on its node). Standard library only: the trainer imports it in every task.

Protocol between the two, all files under `<lab root>/nodes/<node>/`:
- `fault`: one JSON request `{"fault", "token", "job_id", "at"}`. The trainer task on
  that node claims it by renaming it (atomic, so exactly one claimant, and the request
  is consumed: a requeued job runs clean). A request naming another job is left alone.
- `kern.log`: dmesg-style kernel lines (`[  812.123456] NVRM: Xid ...`), appended.
- `faults.jsonl`: one record per fault played out (token, job, rank, pid, time), so the
  injector knows its fault happened and when.
- `nvml.json`: the node's fake GPUs as the node agent's `FakeNvml` reads them.

Log shapes follow what PyTorch, NCCL and the NVIDIA driver print (PyTorch's `[rankN]:`
prefix, ProcessGroupNCCL's watchdog message, NVRM Xid lines with PCI address and pid,
the kernel OOM killer's `Out of memory: Killed process` line).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from enum import StrEnum
from pathlib import Path
from typing import Any

from trainmedic.domain.diagnosis import Evidence
from trainmedic.domain.enums import EvidenceSource
from trainmedic.domain.incident import IncidentSignal


class Fault(StrEnum):
    XID79 = "xid79"
    ECC = "ecc"
    NCCL_CASCADE = "nccl-cascade"
    CUDA_OOM = "cuda-oom"
    USER_EXCEPTION = "user-exception"
    HANG = "hang"
    NODE_DEATH = "node-death"
    HOST_OOM = "host-oom"


# What the catalog should conclude for each fault (used by tests and the benchmark).
EXPECTED_CATEGORY: dict[Fault, str] = {
    Fault.XID79: "gpu_hardware",
    Fault.ECC: "gpu_memory_ecc",
    Fault.NCCL_CASCADE: "cuda_software",
    Fault.CUDA_OOM: "oom_gpu",
    Fault.USER_EXCEPTION: "user_code",
    Fault.HANG: "hang",
    Fault.NODE_DEATH: "node_down",
    Fault.HOST_OOM: "oom_host",
}

# Faults that write kernel lines on the node (the node agent's business).
KERNEL_FAULTS = frozenset({Fault.XID79, Fault.ECC, Fault.HOST_OOM})

# The PCI bus of each fake GPU: real 8-GPU HGX boards spread them over several buses.
_PCI_BUSES = ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")

FAULT_FILE = "fault"
KERNEL_LOG = "kern.log"
FAULT_RECORDS = "faults.jsonl"
NVML_STATE = "nvml.json"


def node_dir(lab_root: Path, node: str) -> Path:
    return lab_root / "nodes" / node


def pci_bus_id(gpu: int) -> str:
    """The fake GPU's bus id as NVML spells it (`00000000:3A:00.0`)."""
    bus = _PCI_BUSES[gpu % len(_PCI_BUSES)] if gpu < len(_PCI_BUSES) else f"{0x60 + gpu:02x}"
    return f"00000000:{bus.upper()}:00.0"


def kernel_pci(gpu: int) -> str:
    """The same GPU as NVRM names it in an Xid line (`0000:3a:00`)."""
    bus = pci_bus_id(gpu).split(":")[1].lower()
    return f"0000:{bus}:00"


def gpu_uuid(node: str, gpu: int) -> str:
    # Stable per (node, gpu), shaped like a real GPU UUID.
    digits = "".join(f"{ord(c):02x}" for c in node)[:12].ljust(12, "0")
    return f"GPU-{gpu:08x}-0000-4000-8000-{digits}"


def _uptime() -> float:
    # dmesg stamps are seconds since boot: CLOCK_MONOTONIC, like the kernel's printk clock.
    return time.monotonic()


def kernel_stamp() -> str:
    return f"[{_uptime():12.6f}]"


def kernel_lines(
    fault: Fault, *, pid: int, node: str = "", gpu: int = 0, comm: str = "python"
) -> list[str]:
    """The kernel's own lines for a fault (without timestamps)."""
    pci = kernel_pci(gpu)
    match fault:
        case Fault.XID79:
            return [
                f"NVRM: Xid (PCI:{pci}): 79, pid={pid}, name={comm}, GPU has fallen off the bus.",
                f"NVRM: GPU {pci}.0: GPU has fallen off the bus.",
                f"NVRM: GPU at PCI:{pci}: {gpu_uuid(node, gpu)}",
            ]
        case Fault.ECC:
            return [
                f"NVRM: Xid (PCI:{pci}): 48, pid={pid}, name={comm}, An uncorrectable double bit"
                " error (DBE) has been detected on GPU in the framebuffer at partition 6,"
                " subpartition 0.",
                f"NVRM: Xid (PCI:{pci}): 63, pid={pid}, name={comm}, Row Remapper: New row"
                " (0x0000000000a1f280) was marked for remapping, reset gpu to activate.",
            ]
        case Fault.HOST_OOM:
            return [
                f"{comm} invoked oom-killer: gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE|__GFP_COMP),"
                " order=0, oom_score_adj=0",
                "oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0-1,"
                f"global_oom,task_memcg=/,task={comm},pid={pid},uid=0",
                f"Out of memory: Killed process {pid} ({comm}) total-vm:912345678kB,"
                " anon-rss:498765432kB, file-rss:0kB, shmem-rss:1024kB, UID:0 pgtables:987654kB"
                " oom_score_adj:0",
            ]
        case _:
            return []


def xid79_signal(node: str, gpu: int, *, pid: int = 4242) -> IncidentSignal:
    """What the node agent reports for an Xid 79 on `gpu` of `node`: the kernel's line,
    for tests and benches that start an incident without injecting the fault."""
    return IncidentSignal(
        source="nvml",
        kind="xid",
        nodes=[node],
        detail=f"Xid 79 on GPU {gpu}",
        evidence=[
            Evidence(
                source=EvidenceSource.KERNEL,
                node=node,
                gpu=gpu,
                text=kernel_lines(Fault.XID79, pid=pid, node=node, gpu=gpu)[0],
            )
        ],
    )


def append_kernel(lab_root: Path, node: str, lines: list[str]) -> None:
    """Append dmesg-style lines to the node's kernel log in one write."""
    if not lines:
        return
    directory = node_dir(lab_root, node)
    directory.mkdir(parents=True, exist_ok=True)
    text = "".join(f"{kernel_stamp()} {line}\n" for line in lines)
    with (directory / KERNEL_LOG).open("a", encoding="utf-8") as handle:
        handle.write(text)


def default_nvml_state(node: str, gpus: int) -> dict[str, Any]:
    return {
        "gpus": [
            {
                "index": i,
                "uuid": gpu_uuid(node, i),
                "pci_bus_id": pci_bus_id(i),
                "ecc_uncorrectable_volatile": 0,
                "ecc_uncorrectable_aggregate": 0,
                "retired_pages_pending": False,
                "remapped_rows_pending": False,
                "remapped_rows_failure": False,
                "recovery_action": "NONE",
                "temperature_c": 41,
                "power_w": 92.5,
                "throttle_reasons": 0,
                "lost": False,
            }
            for i in range(gpus)
        ],
        "xid_events": [],
    }


def update_nvml(lab_root: Path, node: str, gpu: int, fault: Fault, gpus: int = 8) -> None:
    """What the driver would say through NVML after the fault (the fake GPUs' state)."""
    if fault not in (Fault.XID79, Fault.ECC):
        return
    path = node_dir(lab_root, node) / NVML_STATE
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError):
        state = default_nvml_state(node, max(gpus, gpu + 1))
    entry = state["gpus"][gpu]
    if fault is Fault.XID79:
        entry["lost"] = True
        entry["recovery_action"] = "NODE_REBOOT"
        state["xid_events"].append({"gpu": gpu, "xid": 79, "at": time.time()})
    else:
        entry["ecc_uncorrectable_volatile"] += 1
        entry["ecc_uncorrectable_aggregate"] += 1
        entry["remapped_rows_pending"] = True
        entry["recovery_action"] = "GPU_RESET"
        state["xid_events"].append({"gpu": gpu, "xid": 48, "at": time.time()})
    write_json_atomic(path, state)


def write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


# ------------------------------------------------------------------ requests


def request_fault(lab_root: Path, node: str, fault: Fault, token: str, job_id: str | None) -> Path:
    directory = node_dir(lab_root, node)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / FAULT_FILE
    write_json_atomic(
        path, {"fault": fault.value, "token": token, "job_id": job_id, "at": time.time()}
    )
    return path


def claim_fault(lab_root: Path, node: str, job_id: str, claimant: str) -> dict[str, Any] | None:
    """Take the node's pending fault request if it is for this job (or any job)."""
    path = node_dir(lab_root, node) / FAULT_FILE
    try:
        request = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    wanted = request.get("job_id")
    if wanted and str(wanted) != str(job_id):
        return None
    taken = path.with_name(f"{FAULT_FILE}.{claimant}.taken")
    try:
        os.rename(path, taken)  # atomic: one claimant wins, the request is consumed
    except FileNotFoundError:
        return None
    with contextlib.suppress(OSError):
        taken.unlink()
    if not isinstance(request, dict) or request.get("fault") not in {f.value for f in Fault}:
        return None
    return request


def withdraw_fault(lab_root: Path, node: str, token: str) -> bool:
    """Take back an unclaimed request; False when a trainer claimed it first."""
    path = node_dir(lab_root, node) / FAULT_FILE
    try:
        request = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    if request.get("token") != token:
        return False
    withdrawn = path.with_name(f"{FAULT_FILE}.withdrawn")
    try:
        os.rename(path, withdrawn)
    except FileNotFoundError:
        return False
    withdrawn.unlink(missing_ok=True)
    return True


def record_fault(lab_root: Path, node: str, record: dict[str, Any]) -> None:
    directory = node_dir(lab_root, node)
    with (directory / FAULT_RECORDS).open("a", encoding="utf-8") as handle:
        handle.write(json.dumps(record) + "\n")


def find_record(lab_root: Path, node: str, token: str) -> dict[str, Any] | None:
    try:
        lines = (node_dir(lab_root, node) / FAULT_RECORDS).read_text().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("token") == token:
            return record
    return None
