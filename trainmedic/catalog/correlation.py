"""Who logged a line: rank, local rank, Slurm task, node and GPU, from prefixes and text.

Handles the shapes real jobs print: `srun -l` labels (`  3: `), PyTorch's `[rank12]:`,
torchrun's `[default0]:`,
Lightning's `[rank: 1] `, mpirun's `[1,5]<stderr>:`, pdsh/deepspeed `gpu03: `, NCCL's
`host:pid:tid [dev]`, syslog/journal `Mar  3 10:01:02 gpu03 kernel:` (also quoted inside a
line: `Xid errors on instance: ip-26-0-1-2, Error: May 19 07:08:57 ip-26-0-1-2 kernel: ...`),
Slurm's `srun: error: gpu03: task 24: ...` and `slurmstepd-gpu03: error: ...`, Ray's
`(RayTrainWorker pid=1942, ip=10.0.7.57)`, and the timestamps that log shippers put in
front of all of these (`2019-06-02T16:13:44.884Z: `, `[2025-11-09 07:39:30] `).

Names become the job's nodes through its layout: a rank or task through the task
distribution, an address through Slurm's NodeAddr (`addrs`), and a GPU's PCI bus id
through the node's bus id -> index table (`gpus`), where the caller knows them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from trainmedic.domain.hostlist import NODE_NAME

_SRUN_LABEL = re.compile(r"^\s{0,6}(\d{1,6}): ")
# PyTorch's "[rank12]:", and Lightning's rank-prefixed messages "[rank: 1] ".
_RANK = re.compile(r"^\[rank(?:: )?(\d{1,6})\](?::|(?= ))")
_DEFAULT = re.compile(r"^\[(?:default|worker|trainer)(\d{1,4})\]:")
_MPI = re.compile(r"^\[\d+,(\d{1,6})\]<std(?:out|err)>:")
# pdsh/deepspeed "gpu03: ", or a crash handler's (UCX, glog) "[host:pid :thread:tid] ".
_HOST_PREFIX = re.compile(
    r"^(?:([A-Za-z][A-Za-z0-9_.-]{0,62}): |\[([A-Za-z][A-Za-z0-9_.-]{0,62}):\d+ ?:\d+(?::\d+)?\] )"
)
# Slurm (since 21.08) names the node in its step daemon's messages: "slurmstepd-gpu03: ".
_SLURMSTEPD = re.compile(r"^slurmstepd-([A-Za-z0-9][A-Za-z0-9_.-]{0,62}): ")
# Ray's prefix on worker output, colours and all: "(RayTrainWorker pid=1942, ip=10.0.7.57) ",
# "(raylet, ip=172.31.5.171) "; the colour codes may have lost their ESC when pasted.
_RAY = re.compile(
    r"^(?:\x1b?\[[\d;]*m)*\((?:[^()]*?[ ,])?ip=(\d{1,3}(?:\.\d{1,3}){3})\)(?:\x1b?\[[\d;]*m)* ?"
)
# Written by a surviving node's slurmstepd about the job: the node it names is not the one
# that failed ("*** STEP 1943824.0 ON jean-zay-iam17 CANCELLED AT ... DUE TO NODE FAILURE").
_SURVIVOR = re.compile(r"CANCELLED AT \S+ DUE TO NODE FAILURE")
_NCCL = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_.-]{0,62}):(\d+):(\d+) \[(\d{1,3})\]")
# The same prefix quoted inside a line ("error message: `task-646--1-mhpnk:91:123 [0] ...").
_NCCL_INNER = re.compile(r"[\s`'\"(]([A-Za-z0-9][A-Za-z0-9_.-]{0,62}):\d+:\d+ \[(\d{1,3})\] ")
# Its host:pid:tid anywhere on a line: which thread of which process wrote it.
_NCCL_THREAD = re.compile(r"([A-Za-z0-9][\w.-]{0,62}:\d+:\d+) \[\d{1,3}\] ")

_SYSLOG = re.compile(
    r"^(?:[A-Z][a-z]{2} [ \d]\d [\d:]{8}|\d{4}-\d\d-\d\d[T ][\d:.]+(?:Z|[+-][\d:]+)?)"
    r" ([A-Za-z0-9][A-Za-z0-9_.-]{0,62}) \S+?(?:\[\d+\])?:"
)
# A log shipper's or logger's timestamp in front of the line (ISO date, optional zone,
# optionally bracketed); stripped so the prefixes behind it are seen.
_TIMESTAMP = re.compile(
    r"^\[?\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?: ?(?:Z|[+-]\d\d:?\d\d))?\]?:?"
    r"(?: [-|])? "  # Python logging's "... - message", a shipper's "... | message"
)
# A log quoted in an issue or a mail keeps its "> " markers.
_QUOTE = re.compile(r"^>+ ")
# Leading blanks that are not srun's label padding ("  12: ", matched first).
_INDENT = re.compile(r"^\s+(?=[^\s\d])")
_SYSLOG_INNER = re.compile(
    r"\b[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d ([A-Za-z0-9][A-Za-z0-9_.-]{0,62}) kernel:"
)
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_IPV4 = re.compile(r"^\d{1,3}(?:\.\d{1,3}){3}$")
_SRUN_ERR = re.compile(r"srun: error: ([A-Za-z0-9][A-Za-z0-9_.-]{0,62}): tasks? (\d+)")
_NODE_FAIL = re.compile(r"Node failure on ([A-Za-z0-9][A-Za-z0-9_.-]{0,62})")
_ELASTIC_HOST = re.compile(r"^\s*host\s+: (\S+)")
_ELASTIC_RANK = re.compile(r"^\s*rank\s+: (\d+)(?: \(local_rank: (\d+)\))?")
_IN_TEXT_RANK = re.compile(r"\[(?:Rank|PG \d+ Rank|PG ID \d+ PG GUID \S+ Rank) (\d{1,6})\]")
_GPU_IN_OOM = re.compile(r"GPU (\d{1,3})(?:;| has a total)")
_NOT_HOSTS = {
    "srun",
    "slurmstepd",
    "kernel",
    "error",
    "warning",
    "info",
    "traceback",
    "file",
    "c10d",
    # Programs and Python packages with a digit in their name, which print "name: ..."
    # or log as "name.module: ..." ("python3: can't open file", "urllib3.connectionpool:").
    "python2",
    "python3",
    "pip3",
    "urllib3",
    "boto3",
    "h5py",
    "py4j",
    "s3fs",
    "s3transfer",
}
# A Python exception's qualified name ("urllib3.exceptions.ReadTimeoutError: ...") looks
# like a host's dotted name followed by a colon.
_EXCEPTION_NAME = re.compile(r"\.[A-Za-z_]\w*(?:Error|Exception|Warning|Interrupt|Exit)$")
_PCI = re.compile(r"^(?:PCI:)?(?:[0-9A-Fa-f]{4,8}:)?([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})(?:\.[0-7])?$")


@dataclass(slots=True)
class LineContext:
    rank: int | None = None
    local_rank: int | None = None
    task: int | None = None
    node: str | None = None
    gpu: int | None = None
    # The node was only inferred from a rank or task through the job's layout, not
    # written on the line (a host prefix, a syslog host, an NCCL prefix).
    node_from_layout: bool = False


def pci_key(bus_id: str) -> str | None:
    """A PCI bus id in any of its spellings ("00000000:3B:00.0" from NVML, "0000:3b:00"
    or "PCI:0000:3b:00" from an Xid line) as one key: "3b:00"."""
    m = _PCI.match(bus_id.strip())
    return f"{m.group(1)}:{m.group(2)}".lower() if m else None


def short_host(name: str) -> str:
    """gpu03.cluster.local -> gpu03; an IP address stays whole."""
    if _IPV4.match(name):
        return name
    return name.split(".", 1)[0]


class Topology:
    """The job's layout: nodes in Slurm's order and tasks per node, when known; Slurm's
    NodeAddr of each node (address or name -> node); each node's GPUs by PCI bus id."""

    def __init__(
        self,
        nodelist: list[str] | None = None,
        tasks_per_node: int | None = None,
        addrs: dict[str, str] | None = None,
        gpus: dict[str, dict[str, int]] | None = None,
    ):
        self.nodelist = list(nodelist or [])
        self.known = {short_host(n) for n in self.nodelist}
        self.tasks_per_node = tasks_per_node if tasks_per_node and tasks_per_node > 0 else None
        # Keys by short name too: a log may print gpu03.cluster.local or 10.0.7.57.
        self.addrs = {short_host(a): short_host(n) for a, n in (addrs or {}).items()}
        self.gpus: dict[str, dict[str, int]] = {}
        for node, table in (gpus or {}).items():
            keyed = {k: i for bus, i in table.items() if (k := pci_key(bus)) is not None}
            self.gpus[short_host(node)] = keyed

    def gpu_of(self, node: str | None, bus_id: str) -> int | None:
        """The index of the GPU at `bus_id` on `node` (or on the only node known)."""
        key = pci_key(bus_id)
        if key is None:
            return None
        table = self.gpus.get(short_host(node)) if node else None
        if table is None and not node and len(self.gpus) == 1:
            table = next(iter(self.gpus.values()))
        return table.get(key) if table else None

    def node_of_task(self, task: int) -> str | None:
        """Slurm's default block distribution: task t runs on node t // tasks_per_node."""
        if self.tasks_per_node is None or not self.nodelist:
            return None
        index = task // self.tasks_per_node
        return self.nodelist[index] if index < len(self.nodelist) else None

    def slurm_host(self, name: str) -> str | None:
        """A name where Slurm's own message format puts a node ("*** JOB 7 ON xantipa
        CANCELLED"): the place says it is a host, so a name without digits counts too;
        still a valid node name, and one of the job's nodes when the node list is known."""
        host = short_host(name)
        # An address (or alias) Slurm knows as a node's NodeAddr is that node.
        host = self.addrs.get(host, host)
        if not NODE_NAME.match(host):
            return None
        return host if not self.known or host in self.known else None

    def plausible_host(self, name: str) -> str | None:
        """A name in a place that may hold a host or other words: slurm_host's checks,
        and neither an exception's name nor a word that is never a host; without a node
        list, only a name that looks like a cluster host's (it has a digit)."""
        if _EXCEPTION_NAME.search(name):
            return None
        host = self.slurm_host(name)
        if host is None or host.lower() in _NOT_HOSTS:
            return None
        return host if self.known or any(c.isdigit() for c in host) else None

    def plausible_prefix_host(self, name: str) -> str | None:
        """The name in a bare "name: " prefix: a host that pdsh or a launcher put there, or
        a program naming itself (glibc's assert: "train_gpt2cu: llmc/dataloader.h:186:
        ..."). Host names have no underscore (RFC 1123) and program names often do, so
        without the job's node list to check against, one with an underscore is a program.
        (A crash handler's "[host:pid:tid]" is always a host: plausible_host reads it.)"""
        if not self.known and "_" in name:
            return None
        return self.plausible_host(name)


def uncoloured(line: str) -> str:
    """`line` without terminal colour codes (for evidence shown to people)."""
    return _ANSI.sub("", line) if "\x1b" in line else line


def undecorate(line: str) -> str:
    """`line` as the program wrote it: without terminal colours, the "> " of a quoted log,
    or a log shipper's timestamp in front (a syslog line keeps its own, which names the
    host)."""
    line = uncoloured(line)
    for _ in range(3):
        bare = line.lstrip()
        m = _QUOTE.match(bare) or (None if _SYSLOG.match(bare) else _TIMESTAMP.match(bare))
        if m is None:
            break
        line = bare[m.end() :]
    return line


def nccl_thread(text: str) -> str | None:
    """The host:pid:tid of NCCL's prefix on a line, if it has one."""
    return hit.group(1) if (hit := _NCCL_THREAD.search(text)) else None


def parse_line(line: str, topo: Topology) -> LineContext:
    """Strip the known prefixes off `line` and say who logged it."""
    ctx = LineContext()
    rest = undecorate(line)
    for _ in range(5):  # prefixes stack: "gpu03: 12: [rank12]:[E ...]"
        if m := _SRUN_LABEL.match(rest):
            ctx.task = int(m.group(1))
        elif m := _RANK.match(rest):
            ctx.rank = int(m.group(1))
        elif m := _DEFAULT.match(rest):
            ctx.local_rank = int(m.group(1))
        elif m := _MPI.match(rest):
            ctx.rank = int(m.group(1))
        elif (m := _SLURMSTEPD.match(rest)) or (m := _RAY.match(rest)):
            ctx.node = topo.plausible_host(m.group(1)) or ctx.node
        elif (m := _HOST_PREFIX.match(rest)) and (
            host := (
                topo.plausible_prefix_host(m.group(1))
                if m.group(1)
                else topo.plausible_host(m.group(2))
            )
        ):
            ctx.node = host
        elif (m := _TIMESTAMP.match(rest)) and not _SYSLOG.match(rest):
            pass  # a shipper's timestamp; what follows may be a prefix of its own
        elif (m := _QUOTE.match(rest)) or (m := _INDENT.match(rest)):
            pass  # quoted or indented whole: the prefixes follow
        else:
            break
        rest = rest[m.end() :].lstrip()
    if m := _NCCL.match(rest):
        host = topo.plausible_host(m.group(1))
        if host:
            ctx.node = ctx.node or host
            ctx.gpu = int(m.group(4))
    elif m := _SYSLOG.match(rest):
        host = topo.plausible_host(m.group(1))
        ctx.node = ctx.node or host
    elif ctx.node is None and (m := _SYSLOG_INNER.search(rest)):
        ctx.node = topo.plausible_host(m.group(1))
    elif (
        ctx.node is None
        and (m := _NCCL_INNER.search(rest))
        and (host := topo.plausible_host(m.group(1)))
    ):
        ctx.node = host
        ctx.gpu = int(m.group(2))
    if m := _SRUN_ERR.search(rest):
        ctx.node = topo.plausible_host(m.group(1)) or ctx.node
        ctx.task = int(m.group(2))
    elif m := _NODE_FAIL.search(rest):
        ctx.node = topo.plausible_host(m.group(1)) or ctx.node
    elif _SURVIVOR.search(rest):
        ctx.node = None
    if ctx.rank is None and (m := _IN_TEXT_RANK.search(rest)):
        ctx.rank = int(m.group(1))
    if ctx.gpu is None and (m := _GPU_IN_OOM.search(rest)):
        ctx.gpu = int(m.group(1))
    if ctx.node is None:
        if ctx.task is not None:
            ctx.node = topo.node_of_task(ctx.task)
        elif ctx.rank is not None:
            ctx.node = topo.node_of_task(ctx.rank)
        ctx.node_from_layout = ctx.node is not None
    if ctx.rank is None and ctx.task is not None and topo.tasks_per_node:
        ctx.rank = ctx.task  # one task per rank when tasks per node is given
    return ctx


def elastic_field(line: str) -> tuple[str, str | int] | None:
    """A field of torchelastic's 'Root Cause' block: ('host', name) or ('rank', n)."""
    stripped = re.sub(r"^(?:\s{0,6}\d{1,6}: |\[\w+\]:)", "", undecorate(line))
    if m := _ELASTIC_HOST.match(stripped):
        return "host", short_host(m.group(1))
    if m := _ELASTIC_RANK.match(stripped):
        return "rank", int(m.group(1))
    return None
