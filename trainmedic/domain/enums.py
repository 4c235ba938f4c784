"""The product's vocabulary (docs/architecture.md "Failure taxonomy"). Values are contracts."""

from __future__ import annotations

from enum import StrEnum


class Category(StrEnum):
    GPU_HARDWARE = "gpu_hardware"
    GPU_MEMORY_ECC = "gpu_memory_ecc"
    NVLINK_FABRIC = "nvlink_fabric"
    NETWORK_NCCL = "network_nccl"
    INFINIBAND_NIC = "infiniband_nic"
    CUDA_SOFTWARE = "cuda_software"
    OOM_GPU = "oom_gpu"
    OOM_HOST = "oom_host"
    USER_CODE = "user_code"
    DATA_LOADER = "data_loader"
    STORAGE_IO = "storage_io"
    CHECKPOINT = "checkpoint"
    SCHEDULER_PREEMPTION = "scheduler_preemption"
    NODE_DOWN = "node_down"
    HANG = "hang"
    UNKNOWN = "unknown"


class Action(StrEnum):
    RESTART = "restart"
    RESTART_EXCLUDING = "restart_excluding"
    DRAIN_AND_RESTART = "drain_and_restart"
    STOP = "stop"
    WAIT = "wait"
    ESCALATE = "escalate"


# The actions that take a node out of the job's way (drained, or left out of the next
# allocation): only these need a culprit, and only these can hurt an innocent node.
ISOLATING = frozenset({Action.DRAIN_AND_RESTART, Action.RESTART_EXCLUDING})
# The actions after which the job runs again under trainmedic's own requeue.
RESTART_FAMILY = frozenset({Action.RESTART}) | ISOLATING


class Mode(StrEnum):
    MONITOR = "monitor"
    APPROVE = "approve"
    AUTO = "auto"


class Role(StrEnum):
    """How a catalog rule's match counts toward a diagnosis."""

    ROOT = "root"  # a cause: this error makes the job fail by itself
    CASCADE = "cascade"  # a symptom of a failure elsewhere (e.g. NCCL watchdog timeout)
    CONFIRMATION = "confirmation"  # supports a root found elsewhere (e.g. exit code 137)
    CONTEXT = "context"  # never a cause; kept as context (e.g. CUDA_LAUNCH_BLOCKING hint)


class EvidenceSource(StrEnum):
    LOG = "log"
    KERNEL = "kernel"
    SLURM = "slurm"
    NVML = "nvml"
    OPERATOR = "operator"
    # The controller's own observation: a node's authenticated agent fell silent and the
    # node's slurmd did not answer the controller (or Slurm agreed). See channel/liveness.
    AGENT_HEARTBEAT = "agent_heartbeat"
    # The log watcher's own observation that a running job's logs stopped showing
    # training progress (watchers/logs.py, with watchers/progress.py's markers). Its line
    # is written by trainmedic, never read from a job's log, so a job cannot claim a hang
    # of itself by printing it.
    PROGRESS = "progress"


class Stage(StrEnum):
    DETECT = "detect"
    ATTRIBUTE = "attribute"
    PLAN = "plan"
    GATE = "gate"
    ISOLATE = "isolate"
    ACT = "act"
    VERIFY = "verify"
    DONE = "done"


class Outcome(StrEnum):
    RECOVERED = "recovered"
    RECOMMENDED = "recommended"  # monitor mode: advice recorded, nothing done
    NOTED = "noted"  # a running job printed a catalog line; nothing says it is failing
    STOPPED = "stopped"
    WAITING_ON_SCHEDULER = "waiting_on_scheduler"
    ESCALATED = "escalated"
    REJECTED = "rejected"
    ABANDONED = "abandoned"
    CANCELLED = "cancelled"
    FAILED = "failed"
