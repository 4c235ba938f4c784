"""The catalog's records as pydantic models: validated once at load time.

Unknown categories, actions or roles are rejected by the enums; regexes are
compiled here so a bad pattern fails at load, not in the middle of an incident.
"""

from __future__ import annotations

import re
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from trainmedic.domain import ISOLATING, Action, Category, EvidenceSource, Role


class CatalogError(ValueError):
    """The catalog data is inconsistent (duplicate id, bad regex, unknown value...)."""


# Named groups a pattern may capture: who the line is about, when the line itself says
# so ("Rank 1 is running collective", "Worker IP address: 10.0.7.57", "SeqNum=70002"); the
# generated Xid rules capture the Xid number and the GPU's PCI address.
CAPTURE_GROUPS = frozenset({"rank", "ranks", "host", "seq", "xid", "pci"})

# `{line_start}` in a pattern: the start of the line, behind up to three labels that
# launchers put in front of what the program printed (srun's "12: ", PyTorch's
# "[rank3]: ", a host's "gpu07: ", Open MPI's "[1,3]<stderr>:" with --tag-output). For
# errors that count only as raised, not where a warning or a retry merely mentions them.
LINE_START = (
    r"^\s*(?:(?:\[\w+\]: ?|\d{1,6}: |[A-Za-z][\w.-]*\d[\w.-]*: |\[\d+,\d+\]<std(?:out|err)>: ?)"
    r"\s*){0,3}"
)
# `{launched_command}`: the command a subprocess.CalledProcessError quotes, where it runs
# Python or a launcher ("'['/usr/bin/python', 'train.py']'", "'torchrun ..."): a launcher's
# summary of its child, not a program's own subprocess.
LAUNCHED_COMMAND = (
    r"'\[?'?(?:[^'\s,]*/)?(?:python[\d.]*|torchrun|accelerate|deepspeed|mpirun|srun)\b"
)
# `{lightning_child_exit}`: Lightning's launcher reporting a child's exit, under the dead
# child's "[rank: N]"; the rule that reads it writes the code it is about after it
# ("-9\.": SIGKILL).
LIGHTNING_CHILD_EXIT = (
    r"(?:\[rank: (?P<rank>\d+)\] )?Child process with PID \d+ terminated with code "
)
# `{dump_line_start}`: the start of a stack dump's frame line, behind at most one label of
# whoever dumped it (srun's "12: ", "[default3]:", Open MPI's "[1,3]<stderr>:", "gpu07: ")
# and its indentation.
DUMP_LINE_START = (
    r"^(?:\s{0,6}\d{1,6}: |\[\w+\]: ?|\[\d+,\d+\]<std(?:out|err)>: ?|[A-Za-z][\w.-]*: )?\s*"
)
# What the catalog's patterns may name instead of writing the same regex again.
PLACEHOLDERS = {
    "{line_start}": LINE_START,
    "{dump_line_start}": DUMP_LINE_START,
    "{launched_command}": LAUNCHED_COMMAND,
    "{lightning_child_exit}": LIGHTNING_CHILD_EXIT,
}


class Pattern(BaseModel):
    """One regex plus the literal trigger terms that any matching line must contain.

    Triggers are what makes scanning fast: a line is only handed to the regex when
    one of its triggers occurs in it (a case-sensitive substring test). Named groups
    (`rank`, `host`, `seq`) tell the engine whom the line blames.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    regex: str
    triggers: list[str] = Field(min_length=1)
    ignore_case: bool = False

    @field_validator("regex", mode="before")
    @classmethod
    def _expand(cls, value: object) -> object:
        if isinstance(value, str):
            for name, regex in PLACEHOLDERS.items():
                value = value.replace(name, regex)
        return value

    @field_validator("regex")
    @classmethod
    def _compiles(cls, value: str) -> str:
        try:
            compiled = re.compile(value)
        except re.error as error:
            raise ValueError(f"bad regex {value!r}: {error}") from error
        unknown = set(compiled.groupindex) - CAPTURE_GROUPS
        if unknown:
            raise ValueError(
                f"regex {value!r}: unknown named group(s) {sorted(unknown)} "
                f"(known: {sorted(CAPTURE_GROUPS)})"
            )
        return value

    @field_validator("triggers")
    @classmethod
    def _non_empty(cls, value: list[str]) -> list[str]:
        for trigger in value:
            if len(trigger) < 2:
                raise ValueError(f"trigger {trigger!r} is too short to be selective")
        return value

    def compiled(self) -> re.Pattern[str]:
        return re.compile(self.regex, re.IGNORECASE if self.ignore_case else 0)


class Rule(BaseModel):
    """One record of the catalog: a kind of line and what it means."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(pattern=r"^[a-z0-9_]+(\.[a-z0-9_]+)+$")
    # What an operator reads in the headline, the drain reason and the job comment
    # ("uncorrectable ECC error"), instead of a raw log line with rank prefixes.
    title: str = Field(min_length=3, max_length=80)
    role: Role
    category: Category
    action: Action
    transient: bool | None = None
    confidence: float = Field(ge=0.0, le=1.0)
    # Higher wins when several root rules fire: hardware beats the CUDA error it causes,
    # a specific exception beats the generic traceback line.
    precedence: int = Field(default=50, ge=0, le=100)
    # Does this line point at the node it was logged on (hardware), or only at a rank?
    blames_node: bool = False
    # Matched by the exception's type alone ("ValueError:", "RuntimeError:"): on a line
    # that another rule also matches, that rule knows the message better and this yields
    # ("ValueError: (InvalidArgument) TCP send error" is the rendezvous, not a bug).
    generic: bool = False
    # Does the rank the pattern reads off the line name a peer the writer lost (a remote
    # task that stopped heartbeating), not the process whose error lines surround it? A
    # launcher's "local_rank: 0 failed" names the rank whose traceback sits above it and
    # lends it to those lines; a lost peer's rank is that line's own, and lent to none.
    names_lost_peer: bool = False
    # What an isolating rule does when the text names no node: None keeps its action (a
    # GPU's hardware fault is that one node's, and a requeue most likely lands elsewhere);
    # a node's set-up that every node may share (the fabric manager after a driver
    # upgrade) goes to a person instead.
    without_culprit: Action | None = None
    description: str = ""
    patterns: list[Pattern] = Field(min_length=1)
    examples: list[str] = Field(min_length=1)
    # Lines that look close but must NOT match (tests check them too).
    non_examples: list[str] = Field(default_factory=list)
    # Where a line must come from for this rule to read it (empty: anywhere). The lines
    # the engine renders from Slurm's own state ("slurm node gpu03 state=DOWN") mean
    # nothing when a job prints them.
    sources: list[EvidenceSource] = Field(default_factory=list)
    xid: int | None = None

    @property
    def drains(self) -> bool:
        """A root whose line alone takes its node out: what shows a node unfit."""
        return self.role is Role.ROOT and self.action is Action.DRAIN_AND_RESTART

    @model_validator(mode="after")
    def _without_culprit_replaces_an_isolation(self) -> Rule:
        # It says what an isolating rule does with no node to isolate: on any other rule
        # it would never apply, and an isolating replacement would isolate no one.
        if self.without_culprit is not None and (
            self.action not in ISOLATING or self.without_culprit in ISOLATING
        ):
            raise ValueError(
                f"{self.id}: without_culprit applies to a drain or exclusion and must not be one"
            )
        return self


class XidBucket(StrEnum):
    """NVIDIA's 'Resolution Bucket (Immediate Action)' column of the Xid catalog."""

    IGNORE = "IGNORE"
    RESTART_APP = "RESTART_APP"
    RESET_GPU = "RESET_GPU"
    RESTART_BM = "RESTART_BM"  # reboot the node (bare metal)
    WORKFLOW_XID_48 = "WORKFLOW_XID_48"
    WORKFLOW_NVLINK_ERR = "WORKFLOW_NVLINK_ERR"
    WORKFLOW_NVLINK = "WORKFLOW_NVLINK"
    CHECK_MECHANICALS = "CHECK_MECHANICALS"
    CONTACT_SUPPORT = "CONTACT_SUPPORT"
    UPDATE_SW = "UPDATE_SW"


class XidEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    xid: int = Field(ge=1, le=999)
    mnemonic: str
    description: str = ""
    immediate: XidBucket
    title: str | None = Field(default=None, min_length=3, max_length=60)
    category: Category | None = None  # overrides the bucket's default category
    # Where real logs show that the bucket's action does not fit this Xid (13/31 are
    # usually the application's own memory bug: a person looks, no blind restart).
    action: Action | None = None
    transient: bool | None = None  # used only when given (None is a value too)


class BucketPolicy(BaseModel):
    """How one Xid resolution bucket turns into trainmedic's vocabulary."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    role: Role
    category: Category
    action: Action
    transient: bool | None
    confidence: float = Field(ge=0.0, le=1.0)
    precedence: int = Field(ge=0, le=100)
    blames_node: bool


class CatalogFile(BaseModel):
    """The shape of one data file."""

    model_config = ConfigDict(extra="forbid")

    version: str
    rules: list[Rule] = Field(default_factory=list)
    xid_buckets: dict[XidBucket, BucketPolicy] = Field(default_factory=dict)
    xids: list[XidEntry] = Field(default_factory=list)

    @model_validator(mode="after")
    def _xids_need_buckets(self) -> CatalogFile:
        return self
