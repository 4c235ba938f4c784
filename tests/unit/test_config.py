"""Settings and policy: defaults, durations, and named-key errors for bad input."""

from __future__ import annotations

import os
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from trainmedic.config import Policy, load_policy, load_settings, parse_policy
from trainmedic.domain import Action, Mode
from trainmedic.errors import ConfigError


def test_builtin_policy_defaults_to_monitor() -> None:
    policy = load_policy(None)
    assert policy.mode.default is Mode.MONITOR
    assert policy.mode.for_effect(Action.DRAIN_AND_RESTART, "gpu") is Mode.MONITOR


def test_policy_overrides_per_action_and_partition() -> None:
    policy = parse_policy(
        """
        version: site-7
        mode:
          default: approve
          actions: {restart: auto}
          partitions: {debug: auto, prod: monitor}
        approval: {timeout: 1h30m, fallback: abandon}
        rails: {isolation_window: 45m, restart_budget: 2}
        """
    )
    assert policy.version == "site-7"
    assert policy.mode.for_effect(Action.RESTART, None) is Mode.AUTO
    assert policy.mode.for_effect(Action.STOP, None) is Mode.APPROVE
    assert policy.mode.for_effect(Action.RESTART, "prod") is Mode.MONITOR
    assert policy.approval.timeout == timedelta(minutes=90)
    assert policy.rails.isolation_window == timedelta(minutes=45)


def test_bad_policy_names_every_offending_key() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_policy(
            "mode: {default: yolo, actions: {reboot: auto}}\n"
            "rails: {max_isolated_fraction: 2, restart_budget: -1, typo_key: 1}\n"
            "approval: {timeout: soon}\n",
            "site.yaml",
        )
    message = str(caught.value)
    assert "site.yaml" in message
    for key in (
        "mode.default",
        "mode.actions.reboot",
        "rails.max_isolated_fraction",
        "rails.restart_budget",
        "rails.typo_key",
        "approval.timeout",
    ):
        assert key in message, key
    assert len(caught.value.problems) == 6


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("mode: [", "not valid YAML"),
        ("- a\n- b\n", "expected a mapping"),
        ("rails: 5", "rails"),
        # The later of two keys would win silently: here, autonomy over monitoring.
        ("mode:\n  default: monitor\n  default: auto\n", "line 3.*'default' given twice"),
        ("? [a, b]\n: 1\n", "line 1.*unhashable key"),
    ],
)
def test_malformed_policy_files(text: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        parse_policy(text)


def test_unreadable_and_binary_policy_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_policy(tmp_path / "absent.yaml")
    binary = tmp_path / "garbage.yaml"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_policy(binary)


def test_empty_policy_file_means_defaults(tmp_path: Path) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing yet\n")
    assert load_policy(empty) == Policy()


def test_settings_from_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TRAINMEDIC_CLUSTER", "prod-a")
    monkeypatch.setenv("TRAINMEDIC_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("TRAINMEDIC_SLURM_COMMAND_TIMEOUT", "45s")
    monkeypatch.setenv("TRAINMEDIC_TEMPORAL_API_KEY", "s3cret")
    settings = load_settings()
    assert settings.cluster == "prod-a"
    assert settings.temporal_dir == tmp_path / "temporal"
    assert settings.slurm_command_timeout == timedelta(seconds=45)
    assert "s3cret" not in repr(settings)


def test_state_dir_defaults_under_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("TRAINMEDIC_STATE_DIR", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert load_settings().state_dir == tmp_path / "trainmedic"


def test_bad_settings_name_the_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINMEDIC_TEMPORAL_ADDRESS", "no-port-here")
    monkeypatch.setenv("TRAINMEDIC_CLUSTER", "bad name; rm -rf")
    monkeypatch.setenv("TRAINMEDIC_SLURM_ACCESS", "telnet")
    with pytest.raises(ConfigError) as caught:
        load_settings()
    message = str(caught.value)
    for key in ("TRAINMEDIC_TEMPORAL_ADDRESS", "TRAINMEDIC_CLUSTER", "TRAINMEDIC_SLURM_ACCESS"):
        assert key in message


def test_ssh_access_requires_a_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINMEDIC_SLURM_ACCESS", "ssh")
    with pytest.raises(ConfigError, match="TRAINMEDIC_SSH_HOST"):
        load_settings()


# ------------------------------------------------------- hostile or absurd policy input

BILLION_LAUGHS = "\n".join(
    [
        'a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]',
        *(
            f"{name}: &{name} [{', '.join([f'*{prev}'] * 9)}]"
            for prev, name in zip("abcdefgh", "bcdefghi", strict=True)
        ),
        "version: *i",  # 9^9 strings if expanded, e.g. by the error message's repr
    ]
)


def test_alias_bomb_is_refused_at_once_naming_the_file(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(BILLION_LAUGHS)
    with pytest.raises(ConfigError) as caught:
        load_policy(bomb)
    message = str(caught.value)
    assert str(bomb) in message
    assert "aliases" in message
    assert len(message) < 500


def test_any_alias_is_refused_and_anchors_alone_are_fine() -> None:
    with pytest.raises(ConfigError, match=r"line 2, .*aliases"):
        parse_policy("verify: &v {timeout: 5m}\napproval: {timeout: *v}\n")
    assert parse_policy("version: &v site-1\n").version == "site-1"


def test_deep_nesting_and_huge_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="nested more than"):
        parse_policy("version: " + "[" * 20000 + "]" * 20000)
    huge = tmp_path / "huge.yaml"
    huge.write_text("# padding\n" * 100_000)
    with pytest.raises(ConfigError, match="larger than"):
        load_policy(huge)


def test_policy_file_that_is_not_a_regular_file_is_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "policy.fifo"
    os.mkfifo(fifo)  # a plain open() blocks on it until a writer comes
    outcome: list[BaseException | None] = []

    def load() -> None:
        try:
            load_policy(fifo)
            outcome.append(None)
        except BaseException as error:  # handed to the test's thread
            outcome.append(error)

    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    worker.join(timeout=5)
    if worker.is_alive():  # blocked: unblock it (a writer end) before failing
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("load_policy blocked on a FIFO")
    assert isinstance(outcome[0], ConfigError)
    assert "not a regular file" in str(outcome[0])


def test_error_messages_echo_a_bounded_part_of_the_value() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_policy(
            "version: " + "[" * 30 + "1" + "]" * 30 + "\n" + "rails: {typo: " + "x" * 100_000 + "}"
        )
    assert len(str(caught.value)) < 400
    assert "rails.typo" in str(caught.value)


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("approval: {timeout: 0s}", "approval.timeout"),
        ("approval: {timeout: 0}", "approval.timeout"),
        ("verify: {timeout: PT0S}", "verify.timeout"),
        ("verify: {poll_interval: 0s}", "verify.poll_interval"),
        ("verify: {poll_interval: 1ms}", "verify.poll_interval"),
        ("rails: {isolation_window: 0s}", "rails.isolation_window"),
        ("rails: {restart_window: 0m}", "rails.restart_window"),
        ("approval: {timeout: .inf}", "approval.timeout"),
        ("approval: {timeout: -.inf}", "approval.timeout"),
        ("verify: {timeout: .nan}", "verify.timeout"),
        ("approval: {timeout: 99999999999d}", "approval.timeout"),
        ("approval: {timeout: 99999999999999999999}", "approval.timeout"),
        ("rails: {restart_window: 400d}", "rails.restart_window"),
        ("detect: {settle: .inf}", "detect.settle"),
        ("detect: {settle: 99999999999d}", "detect.settle"),
    ],
)
def test_zero_infinite_and_out_of_range_durations_name_the_key(text: str, key: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_policy(text)
    assert caught.value.problems[0].startswith(f"{key}: "), caught.value.problems


def test_zero_settle_means_no_wait_and_sane_values_pass() -> None:
    policy = parse_policy(
        "detect: {settle: 0s}\nverify: {poll_interval: 500ms, timeout: 1s}\n"
        "approval: {timeout: 366d}\nrails: {isolation_window: 1s}\n"
    )
    assert policy.detect.settle == timedelta(0)
    assert policy.verify.poll_interval == timedelta(milliseconds=500)
    # What a workflow receives (JSON, ISO 8601 durations) validates again unchanged.
    assert Policy.model_validate_json(policy.model_dump_json()) == policy


@pytest.mark.parametrize("value", ["0s", "99999999999d", "1e999", "99999999999999999999", "nan"])
def test_bad_command_timeout_names_the_variable(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("TRAINMEDIC_SLURM_COMMAND_TIMEOUT", value)
    with pytest.raises(ConfigError, match="TRAINMEDIC_SLURM_COMMAND_TIMEOUT"):
        load_settings()


# --------------------------------------------------------------------- TLS and secrets


def test_tls_stays_off_without_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = load_settings()
    assert settings.temporal_tls is False
    assert settings.temporal_tls_implied_by is None


def test_an_api_key_turns_tls_on_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINMEDIC_TEMPORAL_API_KEY", "s3cret")
    settings = load_settings()
    assert settings.temporal_tls is True
    assert settings.temporal_tls_implied_by == "TRAINMEDIC_TEMPORAL_API_KEY"


def test_client_certificates_turn_tls_on(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from tests.fixtures.tls import make_pki

    pki = make_pki(tmp_path)  # the files are checked at start-up: real ones
    monkeypatch.setenv("TRAINMEDIC_TEMPORAL_TLS_CERT", str(pki.client.cert))
    monkeypatch.setenv("TRAINMEDIC_TEMPORAL_TLS_KEY", str(pki.client.key))
    assert load_settings().temporal_tls is True


@pytest.mark.parametrize(
    ("variable", "value"),
    [("TRAINMEDIC_TEMPORAL_API_KEY", "s3cret"), ("TRAINMEDIC_TEMPORAL_TLS_CA", "/etc/ca.pem")],
)
def test_credentials_with_tls_explicitly_off_are_refused(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv("TRAINMEDIC_TEMPORAL_TLS", "false")
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError, match=f"TLS is off but {variable}") as caught:
        load_settings()
    assert "s3cret" not in str(caught.value)


async def test_connect_sends_an_api_key_only_over_tls(monkeypatch: pytest.MonkeyPatch) -> None:
    from temporalio.client import Client
    from temporalio.service import TLSConfig

    from trainmedic.temporal import client as tm_client

    seen: dict[str, Any] = {}

    async def fake_connect(target: str, **kwargs: Any) -> str:
        seen.update(kwargs, target=target)
        return "client"

    monkeypatch.setattr(Client, "connect", fake_connect)
    monkeypatch.setenv("TRAINMEDIC_TEMPORAL_API_KEY", "s3cret")
    assert await tm_client.connect(load_settings()) == "client"
    assert seen["api_key"] == "s3cret"
    assert isinstance(seen["tls"], TLSConfig)


@pytest.mark.parametrize("text", [".inf", "nan", "99999999999d", "1e400", float("inf")])
def test_the_duration_type_itself_refuses_what_would_overflow(text: object) -> None:
    """Every Duration field (watchers' intervals too), not only the policy's."""
    from pydantic import TypeAdapter, ValidationError

    from trainmedic.durations import Duration

    with pytest.raises(ValidationError, match=r"out of range|not a duration"):
        TypeAdapter(Duration).validate_python(text)


def test_spool_and_attribution_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from trainmedic.watchers.spoolfile import spool_policy

    key = tmp_path / "site.key"
    key.write_text("k" * 32)
    key.chmod(0o600)
    monkeypatch.setenv("TRAINMEDIC_SPOOL_KEY_FILE", str(key))
    monkeypatch.setenv("TRAINMEDIC_SPOOL_OWNERS", "1001,0")
    settings = load_settings()
    assert spool_policy(settings, signed=True).key == b"k" * 32
    assert spool_policy(settings, signed=False).key is None
    assert {1001, 0} <= spool_policy(settings, signed=True).accepted
    key.chmod(0o644)  # a key others can read signs nothing
    with pytest.raises(ConfigError, match="use 0600"):
        spool_policy(settings, signed=True)
    monkeypatch.setenv("TRAINMEDIC_ATTRIBUTION_SCAN_TIMEOUT", "10m")
    with pytest.raises(ConfigError) as error:
        load_settings()
    assert "ATTRIBUTION_SCAN_TIMEOUT" in str(error.value)
