"""Slurm adapters: the `SlurmBackend` protocol and its command-line implementation, run
locally or over SSH."""

from trainmedic.adapters.slurm.cli import SlurmCli
from trainmedic.adapters.slurm.errors import (
    JobNotRequeueable,
    JobStateConflict,
    NoSuchJob,
    NoSuchNode,
    SlurmCommandFailed,
    SlurmCommandNotFound,
    SlurmError,
    SlurmInvalidArgument,
    SlurmParseError,
    SlurmTimeout,
    SlurmUnavailable,
)
from trainmedic.adapters.slurm.protocol import CommandRunner, CompletedCommand, SlurmBackend
from trainmedic.adapters.slurm.runner import LocalRunner
from trainmedic.adapters.slurm.ssh import (
    SshAuthFailed,
    SshHostKeyRejected,
    SshRunner,
    SshUnavailable,
)

__all__ = [
    "CommandRunner",
    "CompletedCommand",
    "JobNotRequeueable",
    "JobStateConflict",
    "LocalRunner",
    "NoSuchJob",
    "NoSuchNode",
    "SlurmBackend",
    "SlurmCli",
    "SlurmCommandFailed",
    "SlurmCommandNotFound",
    "SlurmError",
    "SlurmInvalidArgument",
    "SlurmParseError",
    "SlurmTimeout",
    "SlurmUnavailable",
    "SshAuthFailed",
    "SshHostKeyRejected",
    "SshRunner",
    "SshUnavailable",
]
