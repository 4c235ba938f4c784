"""One `Settings` (environment, prefix TRAINMEDIC_) and one policy file (YAML).

Settings say *where* things are (Temporal, Slurm, state); the policy says *what
trainmedic may do* (modes, safety rails). Both fail at start-up with every offending
key named, never half-way through a recovery.
"""

from __future__ import annotations

import os
import re
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

from trainmedic.domain.enums import Action, Mode
from trainmedic.durations import Duration
from trainmedic.errors import ConfigError

ENV_PREFIX = "TRAINMEDIC_"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


def default_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "trainmedic"


class Settings(BaseSettings):
    """Where trainmedic runs and what it talks to. Env: TRAINMEDIC_<FIELD>."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore")

    cluster: str = Field("lab", description="Cluster name used in workflow ids and audit.")
    state_dir: Path = Field(default_factory=default_state_dir)
    policy_file: Path | None = Field(None, description="YAML policy; built-in defaults if unset.")

    temporal_address: str = "127.0.0.1:7233"
    temporal_namespace: str = "default"
    temporal_task_queue: str = "trainmedic"
    temporal_tls: bool = False
    temporal_tls_cert: Path | None = None
    temporal_tls_key: Path | None = None
    temporal_tls_ca: Path | None = None
    temporal_api_key: SecretStr | None = None
    temporal_ui_port: int = Field(8233, ge=1, le=65535)

    lab_port_base: int | None = Field(
        None, ge=1024, le=65000, description="First port of the lab (slurmctld); default 16817."
    )

    slurm_access: Literal["local", "ssh"] = "local"
    slurm_bin_dir: Path | None = Field(None, description="Directory of sbatch/scontrol/...")
    slurm_conf: Path | None = Field(None, description="SLURM_CONF for the Slurm commands.")
    slurm_command_timeout: Duration = timedelta(seconds=30)
    ssh_host: str | None = None
    ssh_user: str | None = None
    ssh_port: int = Field(22, ge=1, le=65535)
    ssh_key: Path | None = None

    @field_validator("cluster")
    @classmethod
    def _cluster_name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError("use letters, digits, '.', '_' or '-' (at most 63)")
        return value

    @field_validator("temporal_address")
    @classmethod
    def _host_port(cls, value: str) -> str:
        host, sep, port = value.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError("expected host:port, e.g. 127.0.0.1:7233")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        if self.slurm_access == "ssh" and not self.ssh_host:
            raise ValueError("slurm_access=ssh needs TRAINMEDIC_SSH_HOST")
        if bool(self.temporal_tls_cert) != bool(self.temporal_tls_key):
            raise ValueError("set both TRAINMEDIC_TEMPORAL_TLS_CERT and _KEY, or neither")
        return self

    @property
    def temporal_dir(self) -> Path:
        return self.state_dir / "temporal"

    @property
    def lab_dir(self) -> Path:
        return self.state_dir / "lab"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModePolicy(_Strict):
    """Per cluster, overridable per action kind and per partition (partition wins)."""

    default: Mode = Mode.MONITOR
    actions: dict[Action, Mode] = Field(default_factory=dict)
    partitions: dict[str, Mode] = Field(default_factory=dict)

    def for_effect(self, action: Action, partition: str | None) -> Mode:
        if partition and partition in self.partitions:
            return self.partitions[partition]
        return self.actions.get(action, self.default)


class ApprovalPolicy(_Strict):
    timeout: Duration = timedelta(minutes=30)
    fallback: Literal["escalate", "proceed", "abandon"] = "escalate"


class RailsPolicy(_Strict):
    """Safety rails, checked inside the workflow before every effect."""

    max_isolated_fraction: float = Field(0.25, gt=0.0, le=1.0)
    min_isolated_nodes: int = Field(1, ge=0, description="always allow this many per window")
    isolation_window: Duration = timedelta(hours=1)
    max_drains_per_hour: int = Field(10, ge=0)
    restart_budget: int = Field(3, ge=0, description="restarts per job and root cause")
    restart_window: Duration = timedelta(hours=24)


class DetectPolicy(_Strict):
    # Reports of one failure arrive from several sources within a second or two (log
    # line, kernel Xid, Slurm state, epilog); waiting this long before attributing lets
    # them all count, instead of deciding on the first and ignoring the root cause.
    settle: Duration = timedelta(seconds=2)


class VerifyPolicy(_Strict):
    timeout: Duration = timedelta(minutes=10)
    poll_interval: Duration = timedelta(seconds=2)


class Policy(_Strict):
    version: str = "builtin-1"
    mode: ModePolicy = ModePolicy()
    detect: DetectPolicy = DetectPolicy()
    approval: ApprovalPolicy = ApprovalPolicy()
    rails: RailsPolicy = RailsPolicy()
    verify: VerifyPolicy = VerifyPolicy()


def describe_validation_error(error: ValidationError, prefix: str = "") -> list[str]:
    """Turn pydantic's errors into 'key.path: reason (got X)' lines."""
    lines = []
    for item in error.errors():
        key = ".".join(str(part) for part in item["loc"]) or "(top level)"
        reason = item["msg"].removeprefix("Value error, ")
        got = item.get("input")
        shown = "" if isinstance(got, dict) or got is None else f" (got {got!r})"
        lines.append(f"{prefix}{key}: {reason}{shown}")
    return lines


def load_settings(**overrides: Any) -> Settings:
    """Read settings from the environment; raise ConfigError naming each bad variable."""
    try:
        return Settings(**overrides)
    except ValidationError as error:
        problems = []
        for item in error.errors():
            field = str(item["loc"][0]) if item["loc"] else ""
            key = ENV_PREFIX + field.upper() if field else "settings"
            reason = item["msg"].removeprefix("Value error, ")
            problems.append(f"{key}: {reason}")
        raise ConfigError("environment (TRAINMEDIC_*)", problems) from None


def parse_policy(text: str, source: str = "<policy>") -> Policy:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(error, "problem", None) or str(error)
        raise ConfigError(source, [f"{where}not valid YAML ({problem})"]) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(source, [f"(top level): expected a mapping, got {type(data).__name__}"])
    try:
        return Policy.model_validate(data)
    except ValidationError as error:
        raise ConfigError(source, describe_validation_error(error)) from None


def load_policy(path: Path | None) -> Policy:
    """The built-in defaults when no file is configured; a clear error when it is unreadable."""
    if path is None:
        return Policy()
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise ConfigError(str(path), [f"cannot read the policy file: {error.strerror}"]) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(str(path), [f"not UTF-8 text (byte {error.start})"]) from None
    return parse_policy(text, str(path))
