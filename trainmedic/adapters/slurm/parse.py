"""Parsers for Slurm's outputs, tolerant of the 22.05 and 24.11 shapes.

- `squeue --json`: 22.05 (openapi v0.0.38) gives plain ints, `job_state` as a string and
  `exit_code` as a raw wait status; 24.11 (data_parser v0.0.41/42) wraps many ints as
  `{"set", "infinite", "number"}`, gives `job_state` as a list (state plus flags) and
  `exit_code` as `{"status": [...], "return_code": {...}, "signal": {"id": {...}}}`.
- `sinfo --json`: 22.05 has a top-level `nodes` list (one entry per node, `state` a
  lower-case string plus `state_flags`); 24.11 has a top-level `sinfo` list whose entries
  are per partition and group nodes (`nodes.nodes`) with `node.state` as a list and
  `reason` as `{"description", "time", "user"}` (captured from 24.11.5, see
  tests/data/slurm/24.11/real/).
  `scontrol --json show node` (23.02+) has `nodes` with `state` as a list: handled too.
- `scontrol -o show job|node`: one `Key=Value ...` record per line, in every version.

All functions are pure and raise `SlurmParseError` on shapes they cannot read. This is
the one place that reads Slurm's output: the watcher's lean records
(`trainmedic.adapters.slurm.view`), the pyslurm backend and the lab use the helpers below.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from trainmedic.adapters.slurm.errors import SlurmParseError, SlurmUnavailable
from trainmedic.domain.hostlist import HostlistError, expand
from trainmedic.domain.slurm import (
    JOB_BASE_STATES,
    NODE_BASE_STATES,
    ExitStatus,
    SlurmJob,
    SlurmNode,
    SlurmVersion,
)

_VERSION = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


def parse_version(text: str) -> SlurmVersion:
    """'slurm-wlm 22.05.8' / 'slurm 24.11.1' -> SlurmVersion."""
    match = _VERSION.search(text)
    if not match:
        raise SlurmParseError(f"cannot read a Slurm version from {text.strip()!r}")
    return SlurmVersion(
        major=int(match.group(1)), minor=int(match.group(2)), micro=int(match.group(3) or 0)
    )


# ----------------------------------------------------------------------------- helpers
# Public for the rest of the adapter (view.py, pyslurm_backend.py); nothing outside
# trainmedic.adapters.slurm needs them.


def slurm_int(value: Any) -> int | None:
    """An int from a plain number or a 24.11 `{"set", "infinite", "number"}` object."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value)
    if isinstance(value, Mapping):
        if value.get("infinite") or not value.get("set", True):
            return None
        return slurm_int(value.get("number"))
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return None


def clean_text(value: Any) -> str | None:
    if value is None:
        return None
    text = str(value).strip()
    return text or None


def expand_hosts(value: Any) -> list[str]:
    """Expand a hostlist string (or a list of them); Slurm's '(null)' and '' are empty."""
    if value is None:
        return []
    items = value if isinstance(value, list) else [value]
    names: list[str] = []
    for item in items:
        text = str(item).strip()
        if not text or text in {"(null)", "None"}:
            continue
        try:
            for name in expand(text):
                if name not in names:
                    names.append(name)
        except HostlistError as exc:
            raise SlurmParseError(f"bad hostlist {text!r} from Slurm: {exc}") from exc
    return names


def node_reason(value: Any, user: Any = None) -> tuple[str | None, str | None]:
    """A node's drain/down reason and who set it.

    22.05's sinfo and `scontrol --json` give a string (plus `reason_set_by_user`); 24.11's
    `sinfo --json` gives `{"description", "time", "user"}`, with an empty description
    (and user '') on nodes that have no reason.
    """
    if isinstance(value, Mapping):
        text = clean_text(value.get("description"))
        return text, (clean_text(value.get("user")) if text else None)
    text = clean_text(value)
    return text, (clean_text(user) if text else None)


def split_state(states: Iterable[str], base_states: frozenset[str]) -> tuple[str, list[str]]:
    """['IDLE', 'DRAIN'] -> ('IDLE', ['DRAIN']); the first base state found is the base."""
    base: str | None = None
    flags: list[str] = []
    for raw in states:
        for part in str(raw).split("+"):
            name = part.strip().upper()
            if not name:
                continue
            if name.endswith("*"):  # sinfo/scontrol mark a non-responding node with '*'
                name = name.rstrip("*")
                flags.append("NOT_RESPONDING")
            if base is None and name in base_states:
                base = name
            elif name not in flags:
                flags.append(name)
    return base or "UNKNOWN", flags


def split_node_state(states: Iterable[str]) -> tuple[str, list[str]]:
    """A node's state words -> (base state, flags): ['IDLE', 'DRAIN'], 'DOWN*+DRAIN'."""
    return split_state(states, NODE_BASE_STATES)


# scontrol (and squeue) print a job's *flag* instead of its base state while the flag is
# set: 'JobState=REQUEUED' right after `scontrol requeue`, 'CONFIGURING' while nodes boot.
# What the job effectively is meanwhile (seen in the lab, and Slurm's job_state_string):
_JOB_FLAG_BASE = {
    "REQUEUED": "PENDING",
    "REQUEUE_HOLD": "PENDING",
    "REQUEUE_FED": "PENDING",
    "SPECIAL_EXIT": "PENDING",
    "RESV_DEL_HOLD": "PENDING",
    "CONFIGURING": "RUNNING",
    "POWER_UP_NODE": "RUNNING",
    "RESIZING": "RUNNING",
    "SIGNALING": "RUNNING",
    "STOPPED": "RUNNING",
    # Ending, final state not known yet: neither running nor finished for trainmedic.
    "COMPLETING": "COMPLETING",
    "STAGE_OUT": "COMPLETING",
}


def split_job_state(states: Iterable[str]) -> tuple[str, list[str]]:
    base, flags = split_state(states, JOB_BASE_STATES)
    if base == "UNKNOWN":
        for flag in flags:
            if flag in _JOB_FLAG_BASE:
                return _JOB_FLAG_BASE[flag], flags
    return base, flags


def load_json(text: str | bytes, what: str) -> dict[str, Any]:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SlurmParseError(f"{what}: output is not JSON ({exc})") from exc
    if not isinstance(doc, dict):
        raise SlurmParseError(f"{what}: expected a JSON object")
    return doc


def raise_json_errors(doc: Mapping[str, Any], what: str) -> None:
    """22.05's squeue/sinfo exit 0 and put failures in `errors` (e.g. slurmctld down)."""
    errors = doc.get("errors") or []
    if not errors:
        return
    parts = []
    for error in errors:
        if isinstance(error, Mapping):
            bits = [str(error.get(k)) for k in ("source", "description", "error") if error.get(k)]
            parts.append(": ".join(bits) or json.dumps(error))
        else:
            parts.append(str(error))
    # A read that comes back with errors and no data is what slurmctld being unreachable
    # looks like in 22.05 ("Unspecified error"); reads are safe to retry.
    raise SlurmUnavailable(f"{what} reported errors: {'; '.join(parts)}", stderr="; ".join(parts))


# ----------------------------------------------------------------------------- jobs


def exit_from_json(value: Any) -> ExitStatus | None:
    if value is None:
        return None
    if isinstance(value, Mapping):  # 24.11: PROCESS_EXIT_CODE_VERBOSE
        status = value.get("status") or []
        if isinstance(status, str):
            status = [status]
        signal_obj = value.get("signal") or {}
        signal = slurm_int(signal_obj.get("id")) if isinstance(signal_obj, Mapping) else None
        code = slurm_int(value.get("return_code"))
        if "PENDING" in status or "INVALID" in status:
            return None
        if signal or "SIGNALED" in status or "CORE_DUMPED" in status:
            return ExitStatus(code=None, signal=signal)
        return ExitStatus(code=code, signal=None)
    raw = slurm_int(value)
    return ExitStatus.from_wait_status(raw) if raw is not None else None


def expand_std_path(pattern: str | None, job: SlurmJob) -> str | None:
    """Fill the common filename patterns (%j %A %a %x %u %N %%) the way slurmd does.

    22.05's JSON carries the unexpanded pattern (`train-%j.out`), and an empty string when
    the default `slurm-%j.out` (arrays: `slurm-%A_%a.out`) in the working directory is used.
    """
    if not pattern:
        if job.batch is False or not job.work_dir:
            return None
        default = "slurm-%A_%a.out" if job.array_task_id is not None else "slurm-%j.out"
        pattern = f"{job.work_dir.rstrip('/')}/{default}"
    if "%" not in pattern:
        return pattern
    jobid = str(job.numeric_id) if job.numeric_id is not None else job.job_id
    values = {
        "j": jobid,
        "A": str(job.array_job_id) if job.array_job_id is not None else jobid,
        "a": str(job.array_task_id) if job.array_task_id is not None else "4294967294",
        "x": job.name,
        "u": job.user or "",
        "N": job.batch_host or "",
        "%": "%",
    }

    def fill(match: re.Match[str]) -> str:
        width, key = match.group(1), match.group(2)
        value = values.get(key)
        if value is None:
            return match.group(0)
        if width and value.isdigit():
            return value.zfill(int(width))
        return value

    return re.sub(r"%(\d*)([jAaxuN%])", fill, pattern)


def json_job_id(raw: Mapping[str, Any], numeric: int) -> tuple[str, int | None, int | None]:
    """(job id as squeue prints it, array job id, array task id) of a `--json` job record
    whose numeric `job_id` is `numeric`."""
    array_job = slurm_int(raw.get("array_job_id")) or None  # 0 means "not an array"
    array_task = slurm_int(raw.get("array_task_id")) if array_job else None
    if array_job and array_task is not None:
        return f"{array_job}_{array_task}", array_job, array_task
    if array_job and raw.get("array_task_string"):
        # a pending meta record
        return f"{array_job}_[{raw['array_task_string']}]", array_job, array_task
    return str(numeric), array_job, array_task


def job_from_json(raw: Mapping[str, Any]) -> SlurmJob:
    numeric = slurm_int(raw.get("job_id"))
    if numeric is None:
        raise SlurmParseError(f"job without a job_id: {sorted(raw)[:8]}")
    job_id, array_job, array_task = json_job_id(raw, numeric)
    state_value = raw.get("job_state") or "UNKNOWN"
    states = state_value if isinstance(state_value, list) else [state_value]
    state, flags = split_job_state(states)
    job = SlurmJob(
        job_id=job_id,
        numeric_id=numeric,
        array_job_id=array_job,
        array_task_id=array_task,
        name=str(raw.get("name") or ""),
        user=clean_text(raw.get("user_name")),
        partition=clean_text(raw.get("partition")),
        state=state,
        state_flags=flags,
        state_reason=clean_text(raw.get("state_reason")),
        nodes=expand_hosts(raw.get("nodes")),
        node_count=slurm_int(raw.get("node_count")),
        tasks=slurm_int(raw.get("tasks")),
        tasks_per_node=slurm_int(raw.get("tasks_per_node")) or None,
        excluded_nodes=expand_hosts(raw.get("excluded_nodes")),
        required_nodes=expand_hosts(raw.get("required_nodes")),
        comment=str(raw.get("comment") or ""),
        work_dir=clean_text(raw.get("current_working_directory")),
        requeue=raw.get("requeue") if isinstance(raw.get("requeue"), bool) else None,
        restarts=slurm_int(raw.get("restart_cnt")) or 0,
        batch=raw.get("batch_flag") if isinstance(raw.get("batch_flag"), bool) else None,
        priority=slurm_int(raw.get("priority")),
        batch_host=clean_text(raw.get("batch_host")),
        exit=exit_from_json(raw.get("exit_code")),
    )
    job.stdout_path = expand_std_path(clean_text(raw.get("standard_output")), job)
    job.stderr_path = expand_std_path(clean_text(raw.get("standard_error")), job) or job.stdout_path
    return job


def parse_squeue_json(text: str) -> list[SlurmJob]:
    doc = load_json(text, "squeue --json")
    raise_json_errors(doc, "squeue --json")
    jobs = doc.get("jobs")
    if not isinstance(jobs, list):
        raise SlurmParseError("squeue --json: no 'jobs' list")
    return [job_from_json(raw) for raw in jobs]


# ----------------------------------------------------------------------------- nodes


def _node_from_flat(raw: Mapping[str, Any]) -> SlurmNode:
    """22.05 sinfo `nodes[]` entry, or 23.02+ `scontrol --json show node` entry."""
    state_value = raw.get("state") or "UNKNOWN"
    states = list(state_value) if isinstance(state_value, list) else [state_value]
    states += list(raw.get("state_flags") or [])
    state, flags = split_node_state(states)
    partitions = raw.get("partitions") or []
    if isinstance(partitions, str):
        partitions = [p for p in partitions.split(",") if p]
    reason, reason_user = node_reason(raw.get("reason"), raw.get("reason_set_by_user"))
    return SlurmNode(
        name=str(raw["name"]),
        state=state,
        state_flags=flags,
        reason=reason,
        reason_user=reason_user,
        partitions=[str(p) for p in partitions],
        gres=clean_text(raw.get("gres")),
        cpus=slurm_int(raw.get("cpus")),
        hostname=clean_text(raw.get("hostname")),
        address=clean_text(raw.get("address")),
    )


def _nodes_from_sinfo_entries(entries: Sequence[Mapping[str, Any]]) -> list[SlurmNode]:
    """24.11 `sinfo[]`: one entry per partition and group of alike nodes; merge per node."""
    by_name: dict[str, SlurmNode] = {}
    for entry in entries:
        node_obj = entry.get("node") or {}
        states = node_obj.get("state") or ["UNKNOWN"]
        state, flags = split_node_state(states if isinstance(states, list) else [states])
        nodes_obj = entry.get("nodes") or {}
        grouped = isinstance(nodes_obj, Mapping)
        names = expand_hosts(nodes_obj.get("nodes") if grouped else nodes_obj)
        # `addresses` lists one per node where sinfo filled it (empty in 24.11's default
        # output); only a list that lines up with the names can be trusted.
        addresses = (nodes_obj.get("addresses") if grouped else None) or []
        if not isinstance(addresses, list) or len(addresses) != len(names):
            addresses = [None] * len(names)
        partition = (entry.get("partition") or {}).get("name")
        gres = entry.get("gres") or {}
        cpus = entry.get("cpus") or {}
        reason, reason_user = node_reason(entry.get("reason"))
        for name, address in zip(names, addresses, strict=True):
            node = by_name.get(name)
            if node is None:
                node = SlurmNode(
                    name=name,
                    state=state,
                    state_flags=flags,
                    reason=reason,
                    reason_user=reason_user,
                    gres=clean_text(gres.get("total")) if isinstance(gres, Mapping) else None,
                    cpus=slurm_int(cpus.get("maximum")) if isinstance(cpus, Mapping) else None,
                    address=clean_text(address),
                )
                by_name[name] = node
            if partition and partition not in node.partitions:
                node.partitions.append(str(partition))
    return list(by_name.values())


def parse_sinfo_json(text: str) -> list[SlurmNode]:
    """Nodes from `sinfo --json` (22.05 or 24.11) or `scontrol --json show node`."""
    doc = load_json(text, "sinfo --json")
    raise_json_errors(doc, "sinfo --json")
    if isinstance(doc.get("sinfo"), list):
        return _nodes_from_sinfo_entries(doc["sinfo"])
    if isinstance(doc.get("nodes"), list):
        return [_node_from_flat(raw) for raw in doc["nodes"]]
    raise SlurmParseError("sinfo --json: neither a 'sinfo' nor a 'nodes' list")


# ----------------------------------------------------------------------------- scontrol -o

# Keys whose values are free text and may contain spaces and '=': inside them, only a
# key known to scontrol starts the next field.
_FREE_TEXT_KEYS = frozenset(
    {
        "Comment",
        "AdminComment",
        "SystemComment",
        "Reason",
        "OS",
        "Command",
        "WorkDir",
        "StdOut",
        "StdErr",
        "StdIn",
        "JobName",
        "Features",
        "ActiveFeatures",
        "AvailableFeatures",
        "Extra",
        "Dependency",
    }
)
_KNOWN_KEYS_TEXT = """
Account AccrueTime ActiveFeatures AdminComment AllocMem AllocNode:Sid AllocTRES Arch
ArrayJobId ArrayTaskId ArrayTaskThrottle AvailableFeatures AveWatts BatchFlag BatchHost
Boards BootTime BurstBuffer CPUAlloc CPUEfctv CPULoad CPUTot CPUs/Task CapWatts CfgTRES
Command Comment Container ContainerID Contiguous CoreSpec CoresPerSocket CurrentWatts
Deadline DelayBoot Dependency EligibleTime EndTime ExcNodeList ExitCode ExtSensorsJoules
ExtSensorsTemp ExtSensorsWatts Extra FailedNode Features FreeMem Gres GresUsed GroupId
InstanceId InstanceType JobId JobName JobState LastBusyTime LastSchedEval Licenses
MCS_label MailType MailUser MinCPUsNode MinMemoryCPU MinMemoryNode MinTmpDiskNode
Network Nice NodeAddr NodeHostName NodeList NodeName NtasksPerN:B:S:C NumCPUs NumNodes
NumTasks OS OverSubscribe Owner Partition Partitions Port Power PreemptEligibleTime
PreemptTime Prefer Priority QOS RealMemory Reason Reboot ReqB:S:C:T ReqNodeList Requeue
Reservation ResizeTime Restarts ResumeAfterTime RunTime SchedNodeList Scheduler
SecsPreSuspend SlurmdStartTime Sockets Socks/Node StartTime State StdErr StdIn StdOut
SubmitTime SuspendTime SystemComment TRES ThreadsPerCore TimeLimit TimeMin TmpDisk
TresPerJob TresPerNode TresPerTask UserId Version Weight WorkDir
"""
_KNOWN_KEYS = frozenset(_KNOWN_KEYS_TEXT.split())
_KEY = re.compile(r"^([A-Z][A-Za-z0-9_:/]*)=(.*)$", re.S)
_REASON_STAMP = re.compile(r"\s*\[[^\]@]+@[^\]]+\]\s*$")


def parse_scontrol_records(text: str) -> list[dict[str, str]]:
    """`scontrol -o show job|node` -> one dict per line; values kept as Slurm wrote them."""
    records: list[dict[str, str]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        record: dict[str, str] = {}
        key: str | None = None
        for token in line.split():
            match = _KEY.match(token)
            starts_field = match is not None and (
                key is None or key not in _FREE_TEXT_KEYS or match.group(1) in _KNOWN_KEYS
            )
            if match and starts_field:
                key = match.group(1)
                record[key] = match.group(2)
            elif key is not None:
                record[key] = f"{record[key]} {token}" if record[key] else token
            else:
                raise SlurmParseError(f"scontrol output does not start with a key: {line[:80]!r}")
        records.append(record)
    return records


def null_text(value: Any) -> str | None:
    """Text as Slurm prints it, with its spellings of "nothing" ('(null)', 'N/A', 'None',
    '') as None."""
    if value is None:
        return None
    text = str(value).strip()
    return None if text in {"", "(null)", "N/A", "None"} else text


def _int_field(record: Mapping[str, str], key: str) -> int | None:
    value = null_text(record.get(key))
    if value is None:
        return None
    head = value.split("-")[0]  # NumNodes=4-4 on pending jobs
    return int(head) if head.isdigit() else None


def job_from_scontrol(record: Mapping[str, str]) -> SlurmJob:
    if "JobId" not in record:
        raise SlurmParseError("scontrol job record without JobId")
    numeric = int(record["JobId"])
    array_job = _int_field(record, "ArrayJobId")
    task_text = null_text(record.get("ArrayTaskId"))
    # A pending array's meta record has a task range (ArrayTaskId=0-1), not one task:
    # name it like squeue does (5_[0-1]) rather than as its first task.
    array_task = int(task_text) if task_text and task_text.isdigit() else None
    if array_job and array_task is not None:
        job_id = f"{array_job}_{array_task}"
    elif array_job and task_text:
        job_id = f"{array_job}_[{task_text}]"
    else:
        job_id = str(numeric)
    state, flags = split_job_state([record.get("JobState", "UNKNOWN")])
    tasks_per_node = None
    ntasks = null_text(record.get("NtasksPerN:B:S:C"))
    if ntasks:
        head = ntasks.split(":")[0]
        tasks_per_node = int(head) if head.isdigit() and int(head) > 0 else None
    user = null_text(record.get("UserId"))
    exit_text = null_text(record.get("ExitCode"))
    requeue = null_text(record.get("Requeue"))
    batch = null_text(record.get("BatchFlag"))
    return SlurmJob(
        job_id=job_id,
        numeric_id=numeric,
        array_job_id=array_job,
        array_task_id=array_task if array_job else None,
        name=record.get("JobName", ""),
        user=user.split("(")[0] if user else None,
        partition=null_text(record.get("Partition")),
        state=state,
        state_flags=flags,
        state_reason=null_text(record.get("Reason")),
        nodes=expand_hosts(null_text(record.get("NodeList"))),
        node_count=_int_field(record, "NumNodes"),
        tasks=_int_field(record, "NumTasks"),
        tasks_per_node=tasks_per_node,
        excluded_nodes=expand_hosts(null_text(record.get("ExcNodeList"))),
        required_nodes=expand_hosts(null_text(record.get("ReqNodeList"))),
        comment=(null_text(record.get("Comment")) or ""),
        stdout_path=null_text(record.get("StdOut")),
        stderr_path=null_text(record.get("StdErr")),
        work_dir=null_text(record.get("WorkDir")),
        requeue=(requeue == "1") if requeue is not None else None,
        restarts=_int_field(record, "Restarts") or 0,
        batch=(batch == "1") if batch is not None else None,
        priority=_int_field(record, "Priority"),
        batch_host=null_text(record.get("BatchHost")),
        exit=ExitStatus.from_colon(exit_text) if exit_text else None,
    )


def node_from_scontrol(record: Mapping[str, str]) -> SlurmNode:
    if "NodeName" not in record:
        raise SlurmParseError("scontrol node record without NodeName")
    state, flags = split_node_state([record.get("State", "UNKNOWN")])
    reason = null_text(record.get("Reason"))
    reason_user = None
    if reason:
        # 'Xid 79 [root@2026-11-29T22:40:13]': scontrol appends who set it and when.
        stamp = _REASON_STAMP.search(reason)
        if stamp:
            reason_user = stamp.group(0).strip().strip("[]").split("@")[0] or None
            reason = reason[: stamp.start()].strip() or None
    partitions = null_text(record.get("Partitions"))
    return SlurmNode(
        name=record["NodeName"],
        state=state,
        state_flags=flags,
        reason=reason,
        reason_user=reason_user,
        partitions=partitions.split(",") if partitions else [],
        gres=null_text(record.get("Gres")),
        cpus=_int_field(record, "CPUTot"),
        hostname=null_text(record.get("NodeHostName")),
        address=null_text(record.get("NodeAddr")),
    )
