"""One `Settings` (environment, prefix TRAINMEDIC_) and one policy file (YAML).

Settings say *where* things are (Temporal, Slurm, state); the policy says *what
trainmedic may do* (modes, safety rails). Both fail at start-up with every offending
key named, never half-way through a recovery.
"""

from __future__ import annotations

import math
import os
import re
import reprlib
import socket
import stat
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

from trainmedic.domain.enums import Action, Mode
from trainmedic.durations import format_duration, parse_duration
from trainmedic.errors import ConfigError
from trainmedic.strict_yaml import UniqueKeyLoader
from trainmedic.temporal import tls as tm_tls

ENV_PREFIX = "TRAINMEDIC_"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


def _is_host_port(value: str) -> bool:
    """HOST:PORT with a port of 0-65535 (the split is at the last colon)."""
    host, sep, port = value.rpartition(":")
    return bool(sep and host and port.isdigit() and int(port) <= 65535)


# A policy is a page of YAML; anything far larger is a mistake or an attack, and is
# refused before the parser sees it.
MAX_POLICY_BYTES = 256 * 1024
# Nesting deeper than this is no policy (the deepest key is three levels down); the
# limit also keeps PyYAML's recursive composer far from Python's recursion limit.
MAX_POLICY_DEPTH = 32
# How much of a bad value an error message repeats: enough to recognise it, never a
# megabyte of it.
MAX_ECHO = 80
# Longer than any sensible timeout or window, and far inside what timedelta and
# Temporal's timers can hold (a typo like `99999999999d` is an error, not an overflow).
MAX_DURATION = timedelta(days=366)


# ----------------------------------------------------------------------------- durations


def _say(delta: timedelta) -> str:
    return f"{delta.days}d" if delta == timedelta(days=delta.days) else format_duration(delta)


def _finite_duration(value: Any) -> Any:
    """`parse_duration`, with infinities, NaN and out-of-range values as clean errors."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"must be a finite duration, at most {_say(MAX_DURATION)}")
    try:
        return parse_duration(value)
    except OverflowError:
        raise ValueError(f"out of range; at most {_say(MAX_DURATION)}") from None


def _in_range(low: timedelta, why: str = "") -> AfterValidator:
    def check(value: timedelta) -> timedelta:
        if value < low:
            floor = "more than 0s" if low == timedelta.resolution else f"at least {_say(low)}"
            raise ValueError(f"must be {floor}{why}")
        if value > MAX_DURATION:
            raise ValueError(f"must be at most {_say(MAX_DURATION)}")
        return value

    return AfterValidator(check)


_PARSE = BeforeValidator(_finite_duration)
# A duration where 0 means "no wait" (e.g. the settle window).
Duration = Annotated[timedelta, _PARSE, _in_range(timedelta(0))]
# Timeouts and windows: 0 would time out at once or make the window empty.
PositiveDuration = Annotated[timedelta, _PARSE, _in_range(timedelta.resolution)]
# Poll intervals: a very short one spins on Slurm (every poll is an squeue).
PollInterval = Annotated[
    timedelta, _PARSE, _in_range(timedelta(milliseconds=500), " (each poll asks Slurm)")
]


def default_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "trainmedic"


def notify_event_names(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


class Settings(BaseSettings):
    """Where trainmedic runs and what it talks to. Env: TRAINMEDIC_<FIELD>."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore")

    cluster: str = Field("lab", description="Cluster name used in workflow ids and audit.")
    state_dir: Path = Field(default_factory=default_state_dir)
    policy_file: Path | None = Field(None, description="YAML policy; built-in defaults if unset.")

    temporal_address: str = "127.0.0.1:7233"
    temporal_namespace: str = "default"
    temporal_task_queue: str = "trainmedic"
    # Unset: on when an API key, client certificate or CA is configured (credentials are
    # never sent in plaintext; Temporal Cloud API keys always need TLS).
    temporal_tls: bool | None = None
    temporal_tls_cert: Path | None = None
    temporal_tls_key: Path | None = None
    temporal_tls_ca: Path | None = None
    # The name the server's certificate is checked against (and sent as SNI), when the
    # address is not one of its names (an IP address, a tunnel, a load balancer).
    temporal_tls_server_name: str | None = None
    _tls_implied_by: str | None = PrivateAttr(None)  # said in the log when connecting
    temporal_api_key: SecretStr | None = None
    temporal_ui_port: int = Field(8233, ge=1, le=65535)

    lab_port_base: int | None = Field(
        None, ge=1024, le=65000, description="First port of the lab (slurmctld); default 16817."
    )

    # pyslurm: libslurm in this process (a venv with pyslurm built for the running Slurm,
    # 25.11; `make test-pyslurm`); slurm_conf is what it reads at start-up.
    slurm_access: Literal["local", "ssh", "pyslurm"] = "local"
    slurm_bin_dir: Path | None = Field(None, description="Directory of sbatch/scontrol/...")
    slurm_conf: Path | None = Field(None, description="SLURM_CONF for the Slurm commands.")
    slurm_command_timeout: PositiveDuration = timedelta(seconds=30)
    ssh_host: str | None = None
    ssh_user: str | None = None
    ssh_port: int = Field(22, ge=1, le=65535)
    ssh_key: Path | None = None
    # Required in ssh mode: the server's host key is checked against this file and never
    # accepted on first use.
    ssh_known_hosts: Path | None = Field(None, description="known_hosts file for ssh_host.")

    # Spools (epilog reports, node-agent reports): extra accepted owners besides root and
    # the controller's own user, and the site key that node agents sign reports with.
    spool_owners: str = Field("", description="User names or uids, comma-separated.")
    spool_key_file: Path | None = Field(None, description="HMAC key file (mode 0600).")
    # The agent channel (trainmedic.channel; docs/deploy.md "Node agents"): node agents
    # push findings and heartbeats to the controller over HTTP, signed with keys derived
    # from `agent_key_file` (unset: spool_key_file). Off unless asked for (`trainmedic
    # up` turns it on for the lab); listening needs a key.
    agent_channel: bool = False
    agent_listen: str = Field("0.0.0.0:8790", description="HOST:PORT the receiver binds.")
    agent_key_file: Path | None = Field(None, description="Site key for agents (mode 0600).")
    agent_replay_window: PositiveDuration = timedelta(seconds=30)
    agent_max_body: int = Field(256 * 1024, ge=1024, le=16 * 2**20)
    agent_rate_per_node: float = Field(10.0, gt=0, le=10_000, description="Requests/s/node.")
    # A node whose agent is silent this long while a job runs there is suspect; it is
    # confirmed dead only when its slurmd does not answer `agent_probe_failures` probes in
    # a row (`agent_probe_interval` apart), or Slurm agrees.
    agent_silence: PositiveDuration = timedelta(seconds=6)
    agent_probe_interval: PositiveDuration = timedelta(seconds=1)
    agent_probe_failures: int = Field(2, ge=1, le=20)
    agent_probe_timeout: PositiveDuration = timedelta(seconds=1)
    agent_slurmd_port: int | None = Field(6818, ge=1, le=65535, description="None: no probe.")
    # Attribution reads at most the tail of each log, for at most this long (the
    # workflow gives the activity five minutes).
    attribution_max_scan_bytes: int = Field(64 * 2**20, ge=2**20, le=2**40)
    attribution_scan_timeout: PositiveDuration = timedelta(minutes=2)
    # Node health (quarantine). Controller: where each node's agent serves `GET /health`
    # (its probe listener; `{node}` is replaced by the node's name; both ways signed with
    # the node's key, derived from agent_key_file or spool_key_file) and how long a check
    # may take (dcgmi diag included).
    agent_health_url: str = "http://{node}:8791/health"
    agent_health_timeout: PositiveDuration = timedelta(minutes=4)
    # Agent: `dcgmi` (default: found on PATH; absent: the DCGM check is skipped), and the
    # site's own check, run as `[health_script, NODE]` (exit 0 = healthy).
    health_dcgmi: Path | None = None
    health_dcgm_timeout: PositiveDuration = timedelta(minutes=3)
    health_script: Path | None = None
    health_script_timeout: PositiveDuration = timedelta(minutes=2)
    # Notifications (approval needed, effect applied, job stopped, escalation, breaker
    # tripped) to a webhook; the URL often embeds a token (Slack's does), so it is secret.
    notify_webhook_url: SecretStr | None = None
    notify_format: Literal["json", "slack"] = "json"
    notify_events: str = Field("", description="Events to send, comma-separated; all if empty.")
    notify_timeout: PositiveDuration = timedelta(seconds=10)
    # Telemetry (trainmedic.telemetry): the controller's Prometheus endpoint, HOST:PORT
    # ("" = off), and an OTLP/HTTP collector for metrics and traces ("" = off), e.g.
    # http://otel-collector:4318 (the /v1/metrics and /v1/traces paths are added).
    metrics_address: str = Field("127.0.0.1:9464", description="HOST:PORT; empty: off.")
    otlp_endpoint: str = Field("", description="OTLP/HTTP base URL; empty: off.")

    @field_validator("metrics_address")
    @classmethod
    def _metrics_address(cls, value: str) -> str:
        value = value.strip()
        if value and not _is_host_port(value):
            raise ValueError("expected HOST:PORT (e.g. 127.0.0.1:9464), or empty for off")
        return value

    @field_validator("otlp_endpoint")
    @classmethod
    def _otlp_endpoint(cls, value: str) -> str:
        value = value.strip()
        if value and not value.startswith(("http://", "https://")):
            raise ValueError("expected an http(s) URL (e.g. http://otel-collector:4318)")
        return value.rstrip("/")

    # Two controllers for availability: both serve the task queue, the lease holder runs
    # detection. The id must differ between controllers and stay the same across one's
    # restarts (a restarted controller then leads again at once).
    controller_id: str = Field(default_factory=socket.gethostname, min_length=1, max_length=200)
    lease_ttl: PositiveDuration = timedelta(seconds=10)

    @field_validator("lease_ttl")
    @classmethod
    def _lease_ttl(cls, value: timedelta) -> timedelta:
        if not timedelta(seconds=3) <= value <= timedelta(minutes=10):
            raise ValueError("between 3s and 10m: detection is blind this long after a death")
        return value

    @field_validator("notify_webhook_url")
    @classmethod
    def _webhook_scheme(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not value.get_secret_value().startswith(("https://", "http://")):
            raise ValueError("must start with https:// or http://")
        return value

    @field_validator("notify_events")
    @classmethod
    def _known_events(cls, value: str) -> str:
        from trainmedic.domain.notify import NotifyEvent

        known = {e.value for e in NotifyEvent}
        unknown = [e for e in notify_event_names(value) if e not in known]
        if unknown:
            raise ValueError(
                f"unknown event {', '.join(unknown)}; known: {', '.join(sorted(known))}"
            )
        return value

    @field_validator("attribution_scan_timeout")
    @classmethod
    def _under_the_activity_timeout(cls, value: timedelta) -> timedelta:
        if value > timedelta(minutes=4):
            raise ValueError("at most 4m: the attribute activity itself times out at 5m")
        return value

    # The TLS files are checked at start-up (exists, readable, PEM, a certificate with its
    # own key, not expired), each error naming its variable; skipped when TLS is explicitly
    # off, which _consistent refuses with them anyway.
    @field_validator("temporal_tls_ca", "temporal_tls_cert")
    @classmethod
    def _tls_file(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        if value is not None and info.data.get("temporal_tls") is not False:
            if info.field_name == "temporal_tls_ca":
                tm_tls.check_ca_file(value)
            else:
                tm_tls.check_client_cert(value)
        return value

    @field_validator("temporal_tls_key")
    @classmethod
    def _tls_key(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        cert = info.data.get("temporal_tls_cert")
        if value is not None and info.data.get("temporal_tls") is not False:
            if cert is None:
                tm_tls.read_pem(value, "a PEM private key")
            else:
                tm_tls.check_client_pair(cert, value)
        return value

    @field_validator("agent_health_url")
    @classmethod
    def _agent_url(cls, value: str) -> str:
        if "{node}" not in value or not value.startswith(("http://", "https://")):
            raise ValueError("expected an http(s) URL with {node}, e.g. http://{node}:8791/health")
        try:
            value.format(node="n")
        except (KeyError, IndexError, ValueError):
            raise ValueError("only {node} may appear in braces") from None
        return value

    @field_validator("agent_health_timeout")
    @classmethod
    def _under_the_check_timeout(cls, value: timedelta) -> timedelta:
        if value > timedelta(minutes=9):
            raise ValueError("at most 9m: the health-check activity itself times out at 10m")
        return value

    @field_validator("cluster")
    @classmethod
    def _cluster_name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError("use letters, digits, '.', '_' or '-' (at most 63)")
        return value

    @field_validator("temporal_address")
    @classmethod
    def _host_port(cls, value: str) -> str:
        if not _is_host_port(value):
            raise ValueError("expected host:port, e.g. 127.0.0.1:7233")
        return value

    @field_validator("agent_listen")
    @classmethod
    def _listen_address(cls, value: str) -> str:
        if not _is_host_port(value):
            raise ValueError("expected host:port, e.g. 0.0.0.0:8790 (port 0: any free one)")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        if self.slurm_access == "ssh" and not self.ssh_host:
            raise ValueError("slurm_access=ssh needs TRAINMEDIC_SSH_HOST")
        if self.slurm_access == "ssh" and self.ssh_known_hosts is None:
            raise ValueError(
                "slurm_access=ssh needs TRAINMEDIC_SSH_KNOWN_HOSTS (a known_hosts file with "
                "the host's key: host keys are never accepted automatically)"
            )
        if bool(self.temporal_tls_cert) != bool(self.temporal_tls_key):
            given, lacking = ("CERT", "KEY") if self.temporal_tls_cert else ("KEY", "CERT")
            raise ValueError(
                f"TRAINMEDIC_TEMPORAL_TLS_{given} is set but TRAINMEDIC_TEMPORAL_TLS_{lacking} "
                "is not: mTLS needs both the client certificate and its key (or neither)"
            )
        secured = [
            ENV_PREFIX + name
            for name, value in (
                ("TEMPORAL_API_KEY", self.temporal_api_key),
                ("TEMPORAL_TLS_CERT", self.temporal_tls_cert),
                ("TEMPORAL_TLS_CA", self.temporal_tls_ca),
                ("TEMPORAL_TLS_SERVER_NAME", self.temporal_tls_server_name),
            )
            if value
        ]
        if self.temporal_tls is False and secured:
            raise ValueError(
                f"TRAINMEDIC_TEMPORAL_TLS is off but {', '.join(secured)} is set: keys and "
                "certificates are only used over TLS; unset TRAINMEDIC_TEMPORAL_TLS (or set "
                "it to true), or remove them"
            )
        if self.temporal_tls is None:
            self.temporal_tls = bool(secured)
            self._tls_implied_by = ", ".join(secured) or None
        return self

    @property
    def temporal_tls_implied_by(self) -> str | None:
        """The settings that turned TLS on when TRAINMEDIC_TEMPORAL_TLS was not set."""
        return self._tls_implied_by

    @property
    def site_key_file(self) -> Path | None:
        """The site key agents' keys derive from: agent_key_file, else spool_key_file."""
        return self.agent_key_file or self.spool_key_file

    @property
    def temporal_dir(self) -> Path:
        return self.state_dir / "temporal"

    @property
    def lab_dir(self) -> Path:
        return self.state_dir / "lab"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModePolicy(_Strict):
    """Per cluster, overridable per action kind and per partition (the stricter wins)."""

    default: Mode = Mode.MONITOR
    actions: dict[Action, Mode] = Field(default_factory=dict)
    partitions: dict[str, Mode] = Field(default_factory=dict)

    def for_effect(self, action: Action, partition: str | None) -> Mode:
        if partition and partition in self.partitions:
            return self.partitions[partition]
        return self.actions.get(action, self.default)


class ApprovalPolicy(_Strict):
    timeout: PositiveDuration = timedelta(minutes=30)
    fallback: Literal["escalate", "proceed", "abandon"] = "escalate"


class RailsPolicy(_Strict):
    """Safety rails, checked inside the workflow before every effect."""

    max_isolated_fraction: float = Field(0.25, gt=0.0, le=1.0)
    min_isolated_nodes: int = Field(1, ge=0, description="always allow this many per window")
    isolation_window: PositiveDuration = timedelta(hours=1)
    max_drains_per_hour: int = Field(10, ge=0)
    restart_budget: int = Field(3, ge=0, description="restarts per job and root cause")
    restart_window: PositiveDuration = timedelta(hours=24)


class DetectPolicy(_Strict):
    # Reports of one failure arrive from several sources within a second or two (log
    # line, kernel Xid, Slurm state, epilog); waiting this long before attributing lets
    # them all count, instead of deciding on the first and ignoring the root cause.
    settle: Duration = timedelta(seconds=2)


class VerifyPolicy(_Strict):
    timeout: PositiveDuration = timedelta(minutes=10)
    poll_interval: PollInterval = timedelta(seconds=2)


class QuarantinePolicy(_Strict):
    """When a node trainmedic drained may go back (NodeQuarantineWorkflow)."""

    # A failed health check is re-run after `recheck_after`, doubling each time up to
    # `recheck_max_interval`; after `recheck_limit` failures a person is asked.
    recheck_after: PositiveDuration = timedelta(minutes=10)
    recheck_max_interval: PositiveDuration = timedelta(hours=2)
    recheck_limit: int = Field(5, ge=0, le=1000)
    # A node implicated in this many incidents within the window stays out until a
    # person releases it (`trainmedic nodes release`). 0 turns the rule off.
    repeat_offender_incidents: int = Field(3, ge=0, le=1000)
    repeat_offender_window: PositiveDuration = timedelta(days=7)

    @field_validator("repeat_offender_incidents")
    @classmethod
    def _not_one(cls, value: int) -> int:
        if value == 1:
            raise ValueError(
                "1 would hold every node out at its first incident; use 2 or more, or 0 (off)"
            )
        return value

    @model_validator(mode="after")
    def _intervals(self) -> QuarantinePolicy:
        if self.recheck_max_interval < self.recheck_after:
            raise ValueError(
                f"recheck_max_interval ({_say(self.recheck_max_interval)}) is shorter than "
                f"recheck_after ({_say(self.recheck_after)})"
            )
        return self


class PromotionPolicy(_Strict):
    """When an action kind has earned more autonomy (`trainmedic advice report`,
    `trainmedic mode promote`): at least `min_cases` recommendations judged within
    `window`, of which at least `min_agreement` agreed with what an operator did."""

    min_cases: int = Field(20, ge=1, le=1_000_000)
    min_agreement: float = Field(0.95, gt=0.0, le=1.0)
    window: PositiveDuration = timedelta(days=7)
    # auto takes the person out: by default it is earned by people approving the very
    # effects in approve mode, not by monitor mode's agreement read from Slurm.
    auto_requires_approvals: bool = True


class Policy(_Strict):
    version: str = "builtin-1"
    mode: ModePolicy = ModePolicy()
    detect: DetectPolicy = DetectPolicy()
    approval: ApprovalPolicy = ApprovalPolicy()
    rails: RailsPolicy = RailsPolicy()
    verify: VerifyPolicy = VerifyPolicy()
    quarantine: QuarantinePolicy = QuarantinePolicy()
    promotion: PromotionPolicy = PromotionPolicy()


def _echo(value: Any) -> str:
    """A bad value as an error message shows it: bounded in depth, items and length."""
    shown = _REPR.repr(value)
    return shown if len(shown) <= MAX_ECHO else shown[: MAX_ECHO - 3] + "..."


_REPR = reprlib.Repr()
_REPR.maxlevel = 2
_REPR.maxstring = _REPR.maxother = MAX_ECHO
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = 4


def describe_validation_error(error: ValidationError, prefix: str = "") -> list[str]:
    """Turn pydantic's errors into 'key.path: reason (got X)' lines."""
    lines = []
    for item in error.errors():
        key = ".".join(str(part) for part in item["loc"]) or "(top level)"
        reason = item["msg"].removeprefix("Value error, ")
        got = item.get("input")
        shown = "" if isinstance(got, dict) or got is None else f" (got {_echo(got)})"
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


class _PolicyLoader(UniqueKeyLoader):
    """SafeLoader without aliases, repeated keys, or deep nesting.

    An alias is a reference, so a few lines of nested aliases ("billion laughs") build
    a structure whose every walk (validation, an error message's repr) is exponential. A
    policy has no use for them: they are refused outright, with the line.
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None,
                None,
                "aliases (*name) are not allowed in a policy file; write the value out",
                event.start_mark,
            )
        self._depth += 1
        try:
            if self._depth > MAX_POLICY_DEPTH:
                raise yaml.composer.ComposerError(
                    None,
                    None,
                    f"nested more than {MAX_POLICY_DEPTH} levels deep",
                    self.peek_event().start_mark,
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def parse_policy(text: str, source: str = "<policy>") -> Policy:
    if len(text) > MAX_POLICY_BYTES:
        raise ConfigError(
            source, [f"the policy is {len(text)} characters; at most {MAX_POLICY_BYTES}"]
        )
    try:
        data = yaml.load(text, Loader=_PolicyLoader)  # a SafeLoader: no Python objects
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(error, "problem", None) or str(error)
        raise ConfigError(source, [f"{where}not valid YAML ({problem[:200]})"]) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(source, [f"(top level): expected a mapping, got {type(data).__name__}"])
    try:
        return Policy.model_validate(data)
    except ValidationError as error:
        raise ConfigError(source, describe_validation_error(error)) from None


def _read_policy_file(path: Path) -> bytes:
    """At most MAX_POLICY_BYTES + 1 of a regular file; never blocks on a FIFO or device."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ConfigError(str(path), ["the policy file is not a regular file"])
        with os.fdopen(fd, "rb", closefd=False) as handle:
            return handle.read(MAX_POLICY_BYTES + 1)
    finally:
        os.close(fd)


def load_policy(path: Path | None) -> Policy:
    """The built-in defaults when no file is configured; a clear error when it is unreadable."""
    if path is None:
        return Policy()
    try:
        raw = _read_policy_file(path)
    except OSError as error:
        raise ConfigError(str(path), [f"cannot read the policy file: {error.strerror}"]) from None
    if len(raw) > MAX_POLICY_BYTES:
        raise ConfigError(
            str(path),
            [f"the policy file is larger than {MAX_POLICY_BYTES} bytes; is it the right file?"],
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(str(path), [f"not UTF-8 text (byte {error.start})"]) from None
    return parse_policy(text, str(path))
