"""Typed Slurm errors, and the mapping from Slurm's own messages to them.

`retryable` tells the activity layer whether trying again can help (the controller was
unreachable or slow) or not (the job or node does not exist, the job cannot be requeued,
the request is invalid). The messages below were captured from Slurm 22.05's commands
(see tests/data/slurm/22.05/errors.json) and checked against Slurm 24.11.5, which prints the
same strings (tests/data/slurm/24.11/real/errors.txt). Some go to stdout, not stderr
("Job 5_7 not found", "Node nope not found"): callers classify `stderr or stdout`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from trainmedic.errors import TrainmedicError


class SlurmError(TrainmedicError):
    retryable: bool = False

    def __init__(
        self,
        message: str,
        *,
        argv: Sequence[str] = (),
        returncode: int | None = None,
        stderr: str = "",
    ) -> None:
        self.argv = list(argv)
        self.returncode = returncode
        self.stderr = stderr
        super().__init__(message)


class SlurmUnavailable(SlurmError):
    """slurmctld could not be reached (down, restarting, network)."""

    retryable = True


class SlurmTimeout(SlurmError):
    """The command or slurmctld took longer than allowed."""

    retryable = True


class NoSuchJob(SlurmError):
    pass


class NoSuchNode(SlurmError):
    pass


class JobNotRequeueable(SlurmError):
    """The job has requeue disabled (--no-requeue, JobRequeue=0) or is not a batch job."""


class JobStateConflict(SlurmError):
    """The job is in a state where the request makes no sense (already finished, no longer
    pending, still pending). Re-read the job; do not retry blindly."""


class SlurmInvalidArgument(SlurmError):
    """Slurm refused the request itself (missing reason, bad state, bad value)."""


class SlurmCommandFailed(SlurmError):
    """A Slurm command failed in a way none of the other errors describe."""


class SlurmCommandNotFound(SlurmError):
    """The Slurm client binary is not installed or not on the configured path."""


class SlurmParseError(SlurmError):
    """Slurm answered, but in a shape this adapter does not understand."""


# Order matters: the first pattern that matches wins. Transport problems come first,
# because libslurm prefixes them with the call that failed ("slurm_load_jobs error: ...").
_PATTERNS: list[tuple[re.Pattern[str], type[SlurmError]]] = [
    (re.compile(r"Socket timed out on send/recv|timed out", re.I), SlurmTimeout),
    (
        re.compile(
            r"Unable to contact slurm controller|Connection refused|"
            r"Communication connection failure|Zero Bytes were transmitted|"
            r"Slurm backup controller in standby mode|"
            r"Unexpected message received",  # 22.05's scontrol requeue when slurmctld is down
            re.I,
        ),
        SlurmUnavailable,
    ),
    (re.compile(r"Invalid job id specified|Job \S+ not found|Invalid job id", re.I), NoSuchJob),
    (re.compile(r"Invalid node name specified|Node \S+ not found", re.I), NoSuchNode),
    (re.compile(r"Requested operation is presently disabled", re.I), JobNotRequeueable),
    (
        re.compile(r"Only batch jobs can be requeued|Job is not a batch job", re.I),
        JobNotRequeueable,
    ),
    (
        re.compile(
            r"Job is no longer pending execution|Job has already finished|"
            r"Job is pending execution|Requested operation not supported on this job",
            re.I,
        ),
        JobStateConflict,
    ),
    (
        re.compile(
            r"must specify a reason|Invalid node state specified|Invalid input|"
            r"Invalid argument|Request aborted|Invalid .* specification",
            re.I,
        ),
        SlurmInvalidArgument,
    ),
    (re.compile(r"Access/permission denied|not authorized", re.I), SlurmCommandFailed),
]


def classify(argv: Sequence[str], returncode: int | None, stderr: str) -> SlurmError:
    """Turn a failed Slurm command into the matching typed error."""
    text = stderr.strip()
    command = " ".join(argv)
    for pattern, error_type in _PATTERNS:
        if pattern.search(text):
            return error_type(f"{command}: {text}", argv=argv, returncode=returncode, stderr=stderr)
    why = text or f"exit status {returncode} and no message"
    return SlurmCommandFailed(f"{command}: {why}", argv=argv, returncode=returncode, stderr=stderr)
