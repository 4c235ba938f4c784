"""The Helm chart (deploy/helm/trainmedic) rendered, linted and schema-checked by Helm's
own Go engine, through `helm-python-sdk` (offline: no cluster, no `helm` binary).

Both Slurm access modes render from the example values in the chart's `ci/` folder,
which docs/deploy.md shows. The rendered objects are checked against trainmedic itself:
every TRAINMEDIC_* variable must be a real `Settings` field and the rendered
environment must load in `Settings`; the policy ConfigMap must parse as a `Policy`;
the schema's policy part must match the `Policy` model. Bad values are refused by
Helm with its own message (`helm install` and `helm template` validate the same way).
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from trainmedic.config import ENV_PREFIX, Policy, Settings, load_settings, parse_policy
from trainmedic.domain.enums import Action, Mode
from trainmedic.domain.notify import NotifyEvent

if os.environ.get("TRAINMEDIC_REQUIRE_LAB") == "1":
    import helm_python as helm
else:
    helm = pytest.importorskip(
        "helm_python", reason="helm-python-sdk is a dev dependency: pip install -e '.[dev]'"
    )

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "trainmedic"
RELEASE = "tm"
NAMESPACE = "trainmedic"
# The oldest Kubernetes the chart supports (Chart.yaml kubeVersion: native sidecars).
KUBE_VERSION = "v1.29.0"
MODES = ("incluster", "ssh")

Obj = dict[str, Any]


# ----------------------------------------------------------------------------- helpers


@pytest.fixture(scope="module")
def chart() -> Iterator[Any]:
    with helm.Chart.load(CHART) as loaded:
        yield loaded


def ci_values(mode: str) -> Obj:
    data = yaml.safe_load((CHART / "ci" / f"{mode}-values.yaml").read_text())
    assert isinstance(data, dict)
    return data


def merged(base: Obj, change: Obj) -> Obj:
    """`base` with `change` merged in (nested mappings merge). A None stays: Helm reads
    a null in the user's values as "delete the chart's default" (`--set key=null`)."""
    out = copy.deepcopy(base)
    for key, value in change.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


def render(chart: Any, values: Obj) -> list[Obj]:
    """Helm's rendering of every template into Kubernetes objects (NOTES.txt left out)."""
    rendered = chart.render(values, name=RELEASE, namespace=NAMESPACE)
    objects = []
    for path, text in sorted(rendered.items()):
        if path.endswith("NOTES.txt"):
            continue
        objects += [doc for doc in yaml.safe_load_all(text) if doc]
    return objects


def notes(chart: Any, values: Obj) -> str:
    rendered = chart.render(values, name=RELEASE, namespace=NAMESPACE)
    return next(text for path, text in rendered.items() if path.endswith("NOTES.txt"))


def one(objects: list[Obj], kind: str) -> Obj:
    found = [o for o in objects if o["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, got {[o['metadata']['name'] for o in found]}"
    return found[0]


def pod(objects: list[Obj], kind: str) -> Obj:
    spec: Obj = one(objects, kind)["spec"]["template"]["spec"]
    return spec


def container(pod_spec: Obj, name: str) -> Obj:
    for c in pod_spec.get("initContainers", []) + pod_spec["containers"]:
        if c["name"] == name:
            return c
    raise AssertionError(f"no container {name!r} in the pod")


def all_containers(pod_spec: Obj) -> list[Obj]:
    return list(pod_spec.get("initContainers", [])) + list(pod_spec["containers"])


def env(c: Obj) -> dict[str, Obj]:
    return {item["name"]: item for item in c.get("env", [])}


def plain_env(c: Obj) -> dict[str, str]:
    return {name: item["value"] for name, item in env(c).items() if "value" in item}


def volume(pod_spec: Obj, name: str) -> Obj:
    for v in pod_spec["volumes"]:
        if v["name"] == name:
            return v
    raise AssertionError(f"no volume {name!r} in the pod")


def mount(c: Obj, name: str) -> Obj:
    for m in c.get("volumeMounts", []):
        if m["name"] == name:
            return m
    raise AssertionError(f"container {c['name']} does not mount {name!r}")


def mounted_source(pod_spec: Obj, c: Obj, path: str) -> tuple[Obj, str]:
    """The volume that `path` lies in for container `c`, and the path inside it."""
    best: tuple[Obj, str] | None = None
    for m in c.get("volumeMounts", []):
        root = m["mountPath"].rstrip("/") + "/"
        if path.startswith(root) and (best is None or len(root) > len(best[1])):
            best = (volume(pod_spec, m["name"]), root)
    assert best is not None, f"{path} is on no volume of {c['name']}"
    return best[0], path[len(best[1]) :]


def install_copies(pod_spec: Obj) -> dict[str, str]:
    """install-keys' copies: destination -> source (`install -m 0400 SRC DEST`)."""
    script = container(pod_spec, "install-keys")["command"][-1]
    copies = {}
    for line in script.splitlines():
        words = line.split()
        if words[:3] == ["install", "-m", "0400"]:
            copies[words[4]] = words[3]
    return copies


def schema_error(chart: Any, values: Obj) -> str:
    """Helm's message for values that the schema refuses (and the same refusal when
    rendering, which is what `helm install` and `helm template` do)."""
    with pytest.raises(helm.HelmValuesError) as refused:
        chart.validate_schema(values)
    with pytest.raises(helm.HelmValuesError) as at_render:
        chart.render(values, name=RELEASE, namespace=NAMESPACE)
    # The same findings (Helm lists them in no fixed order).
    findings = {line.strip() for line in str(refused.value).splitlines()[1:]}
    assert findings <= {line.strip() for line in str(at_render.value).splitlines()}
    return str(refused.value)


# ------------------------------------------------------------------------- Helm lint


@pytest.mark.parametrize("mode", MODES)
def test_helm_lint_is_clean_in_both_modes(mode: str) -> None:
    report = helm.lint(CHART, ci_values(mode), strict=True, kube_version=KUBE_VERSION)
    assert report["total_charts_linted"] == 1
    assert report["errors"] == []
    # Severity 1 is information ("icon is recommended"); warnings and errors fail.
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_helm_lint_reports_a_bad_values_file_with_helms_message(tmp_path: Path) -> None:
    bad = tmp_path / "values.yaml"
    bad.write_text("cluster: gpu-a\nslurmAccess: carrier-pigeon\n")
    report = helm.lint(CHART, yaml.safe_load(bad.read_text()), kube_version=KUBE_VERSION)
    errors = "\n".join(report["errors"])
    assert "at '/slurmAccess': value must be one of 'inCluster', 'ssh'" in errors
    assert any(m["severity"] == 3 and m["path"] == "values.yaml" for m in report["messages"])


def test_the_chart_declares_its_license_and_kubernetes_version(chart: Any) -> None:
    meta = chart.metadata
    assert meta["apiVersion"] == "v2"
    assert meta["annotations"]["licenses"] == "Apache-2.0"
    assert meta["annotations"]["artifacthub.io/license"] == "Apache-2.0"
    assert meta["kubeVersion"].startswith(">=1.29")  # native sidecars (munged)


# -------------------------------------------------------------------- objects, per mode


def test_incluster_mode_objects(chart: Any) -> None:
    objects = render(chart, ci_values("incluster"))
    kinds = sorted(o["kind"] for o in objects)
    assert kinds == ["ConfigMap", "DaemonSet", "Deployment", "Service", "ServiceAccount"]
    spec = pod(objects, "Deployment")
    controller = container(spec, "controller")
    values = plain_env(controller)
    assert values["TRAINMEDIC_SLURM_ACCESS"] == "local"
    assert values["SLURM_CONF"] == values["TRAINMEDIC_SLURM_CONF"] == "/etc/slurm/slurm.conf"
    assert not [name for name in values if name.startswith("TRAINMEDIC_SSH_")]
    assert controller["command"] == ["trainmedic", "worker", "--hang-after", "10m"]

    # slurm.conf: the Slurm deployment's ConfigMap, read-only at /etc/slurm.
    config, inside = mounted_source(spec, controller, values["SLURM_CONF"])
    assert config["configMap"]["name"] == "slurm-config" and inside == "slurm.conf"
    assert mount(controller, "slurm-config")["readOnly"] is True

    # munged: a native sidecar (starts before the controller) with the copied key, on
    # the socket the controller's Slurm commands use.
    munged = container(spec, "munged")
    assert munged in spec["initContainers"] and munged["restartPolicy"] == "Always"
    assert spec["initContainers"][0]["name"] == "install-keys"  # the key is there first
    args = dict(a.split("=", 1) for a in munged["command"] if a.startswith("--") and "=" in a)
    assert args["--socket"] == "/run/munge/munge.socket.2"
    assert mount(munged, "munge-socket")["mountPath"] == "/run/munge"
    assert mount(controller, "munge-socket")["mountPath"] == "/run/munge"
    assert volume(spec, "munge-socket")["emptyDir"]["medium"] == "Memory"
    source = install_copies(spec)[args["--key-file"]]
    secret, item = mounted_source(spec, container(spec, "install-keys"), source)
    assert secret["secret"]["secretName"] == "slurm-munge"
    assert {"key": "munge.key", "path": item} in secret["secret"]["items"]
    assert munged["startupProbe"]["exec"]["command"] == ["test", "-S", args["--socket"]]

    # Temporal: the CA from its Secret.
    ca, inside = mounted_source(spec, controller, values["TRAINMEDIC_TEMPORAL_TLS_CA"])
    assert ca["secret"]["secretName"] == "temporal-ca" and inside == "ca.crt"


def test_ssh_mode_objects(chart: Any) -> None:
    objects = render(chart, ci_values("ssh"))
    assert sorted(o["kind"] for o in objects) == [
        "ConfigMap",
        "Deployment",
        "Service",
        "ServiceAccount",
    ]
    spec = pod(objects, "Deployment")
    controller = container(spec, "controller")
    values = plain_env(controller)
    assert values["TRAINMEDIC_SLURM_ACCESS"] == "ssh"
    assert values["TRAINMEDIC_SSH_HOST"] == "login1.cluster.example"
    assert values["TRAINMEDIC_SSH_USER"] == "slurm"
    assert values["TRAINMEDIC_SSH_PORT"] == "22"
    assert "SLURM_CONF" not in values and "TRAINMEDIC_SLURM_CONF" not in values
    assert "munged" not in [c["name"] for c in all_containers(spec)]
    assert not [v for v in spec["volumes"] if v["name"].startswith(("munge", "slurm"))]

    # The key and known_hosts come from the one Secret, mounted 0400; the key is used
    # from install-keys' 0400 copy owned by the pod's user.
    ssh = volume(spec, "ssh")["secret"]
    assert ssh["secretName"] == "trainmedic-ssh" and ssh["defaultMode"] == 0o400
    items = {i["key"]: i["path"] for i in ssh["items"]}
    assert set(items) == {"id_ed25519", "known_hosts"}
    known, inside = mounted_source(spec, controller, values["TRAINMEDIC_SSH_KNOWN_HOSTS"])
    assert known["name"] == "ssh" and inside == items["known_hosts"]
    assert mount(controller, "ssh")["readOnly"] is True
    source = install_copies(spec)[values["TRAINMEDIC_SSH_KEY"]]
    copied_from, inside = mounted_source(spec, container(spec, "install-keys"), source)
    assert copied_from["name"] == "ssh" and inside == items["id_ed25519"]
    keys, _ = mounted_source(spec, controller, values["TRAINMEDIC_SSH_KEY"])
    assert keys["emptyDir"]["medium"] == "Memory"
    assert mount(controller, "keys")["readOnly"] is True

    # Temporal Cloud: the API key only ever from its Secret.
    api_key = env(controller)["TRAINMEDIC_TEMPORAL_API_KEY"]
    assert "value" not in api_key
    assert api_key["valueFrom"]["secretKeyRef"] == {"name": "temporal-cloud", "key": "api-key"}


def test_ssh_mode_without_the_key_copy_would_be_noticed(chart: Any) -> None:
    """The helpers above really look: a key path outside every volume is an error."""
    spec = pod(render(chart, ci_values("ssh")), "Deployment")
    with pytest.raises(AssertionError, match="on no volume"):
        mounted_source(spec, container(spec, "controller"), "/home/trainmedic/.ssh/id")


# ------------------------------------------------------------ the chart and the code agree

# Every optional setting switched on, so that every TRAINMEDIC_* the chart can emit shows.
EVERYTHING = {
    "temporal": {
        "tls": {
            "enabled": True,
            "caSecret": "ca",
            "clientCertSecret": "client-cert",
            "serverName": "temporal.example",
        },
        "apiKey": {"existingSecret": "api"},
    },
    "notify": {"webhookSecret": "hook", "format": "slack", "events": ["escalated"]},
    "slurm": {"commandTimeout": "45s", "binDir": "/opt/slurm/bin"},
    "spool": {"owners": "slurm,401", "keySecret": "spool-key"},
}


@pytest.mark.parametrize("mode", MODES)
def test_every_trainmedic_variable_is_a_real_setting(chart: Any, mode: str) -> None:
    values = merged(ci_values(mode), EVERYTHING)
    if mode == "ssh":
        values = merged(values, {"slurm": {"ssh": {"remoteSlurmConf": "/etc/slurm/slurm.conf"}}})
    objects = render(chart, values)
    names = set()
    for kind in ("Deployment", "DaemonSet"):
        for o in objects:
            if o["kind"] == kind:
                for c in all_containers(o["spec"]["template"]["spec"]):
                    names |= {n for n in env(c) if n.startswith(ENV_PREFIX)}
    fields = {ENV_PREFIX + name.upper() for name in Settings.model_fields}
    # Settings ignores unknown variables: a misspelt one would silently do nothing.
    assert names - fields == set()
    expected = {
        "TRAINMEDIC_TEMPORAL_TLS",
        "TRAINMEDIC_TEMPORAL_TLS_CERT",
        "TRAINMEDIC_TEMPORAL_TLS_SERVER_NAME",
        "TRAINMEDIC_SPOOL_KEY_FILE",
        "TRAINMEDIC_NOTIFY_WEBHOOK_URL",
        "TRAINMEDIC_METRICS_ADDRESS",
    }
    assert expected <= names


@pytest.mark.parametrize("mode", MODES)
def test_the_rendered_environment_loads_in_settings(
    chart: Any, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Settings reads the Temporal CA's file at start-up (PEM, expiry), which no test
    # here has: TLS files are tests/unit/test_config_temporal_tls.py's subject.
    values = merged(ci_values(mode), {"temporal": {"tls": {"caSecret": ""}}})
    controller = container(pod(render(chart, values), "Deployment"), "controller")
    for name in list(os.environ):
        if name.startswith(ENV_PREFIX):
            monkeypatch.delenv(name)
    for name, item in env(controller).items():
        # Values from Secrets are the operator's; any non-empty string stands for them.
        monkeypatch.setenv(name, item.get("value", "from-a-secret"))
    settings = load_settings()
    assert settings.cluster == ci_values(mode)["cluster"]
    assert settings.policy_file == Path("/etc/trainmedic/policy/policy.yaml")
    assert settings.metrics_address == "0.0.0.0:9464"  # reachable from outside the pod
    if mode == "ssh":
        assert settings.slurm_access == "ssh"
        assert settings.ssh_host == "login1.cluster.example"
        assert settings.ssh_known_hosts is not None
        assert settings.temporal_tls is True  # an API key turns TLS on
    else:
        assert settings.slurm_access == "local"
        assert settings.slurm_conf == Path("/etc/slurm/slurm.conf")
        assert settings.spool_key_file is not None


def test_metrics_are_served_to_the_cluster_behind_a_service(chart: Any) -> None:
    objects = render(chart, merged(ci_values("ssh"), {"metrics": {"port": 9100}}))
    spec = pod(objects, "Deployment")
    controller = container(spec, "controller")
    assert plain_env(controller)["TRAINMEDIC_METRICS_ADDRESS"] == "0.0.0.0:9100"
    assert controller["ports"] == [{"name": "metrics", "containerPort": 9100, "protocol": "TCP"}]
    (service,) = [o for o in objects if o["kind"] == "Service"]
    assert service["metadata"]["name"] == "tm-trainmedic-metrics"
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"
    # The Service selects the controller's pod and nothing else (not the node agents).
    selector = service["spec"]["selector"]
    pod_labels = next(o for o in objects if o["kind"] == "Deployment")["spec"]["template"]
    assert selector.items() <= pod_labels["metadata"]["labels"].items()
    assert selector["app.kubernetes.io/component"] == "controller"

    off = render(chart, merged(ci_values("ssh"), {"metrics": {"port": 0}}))
    controller = container(pod(off, "Deployment"), "controller")
    assert plain_env(controller)["TRAINMEDIC_METRICS_ADDRESS"] == ""
    assert "ports" not in controller and "Service" not in {o["kind"] for o in off}
    refused = schema_error(chart, merged(ci_values("ssh"), {"metrics": {"port": 70000}}))
    assert "metrics" in refused

    # The Service name is a DNS label: a long release name still fits in 63 characters.
    long_release = "a" * 53
    rendered = chart.render(ci_values("ssh"), name=long_release, namespace=NAMESPACE)
    services = [
        doc
        for path, text in rendered.items()
        if not path.endswith("NOTES.txt")
        for doc in yaml.safe_load_all(text)
        if doc and doc.get("kind") == "Service"
    ]
    (long_service,) = services
    assert len(long_service["metadata"]["name"]) <= 63
    assert long_service["metadata"]["name"].endswith("-metrics")

    ipv6 = render(chart, merged(ci_values("ssh"), {"metrics": {"bindAddress": "[::]"}}))
    controller = container(pod(ipv6, "Deployment"), "controller")
    assert plain_env(controller)["TRAINMEDIC_METRICS_ADDRESS"] == "[::]:9464"


def test_temporal_tls_switch_and_mtls(chart: Any) -> None:
    def controller_env(change: Obj) -> dict[str, str]:
        objects = render(chart, merged(ci_values("ssh"), {"temporal": change}))
        return plain_env(container(pod(objects, "Deployment"), "controller"))

    assert "TRAINMEDIC_TEMPORAL_TLS" not in controller_env({})  # unset: Settings decides
    assert controller_env({"tls": {"enabled": False}})["TRAINMEDIC_TEMPORAL_TLS"] == "false"
    mtls = controller_env({"tls": {"clientCertSecret": "tm-client"}})
    assert mtls["TRAINMEDIC_TEMPORAL_TLS_CERT"].endswith("/tls.crt")
    assert mtls["TRAINMEDIC_TEMPORAL_TLS_KEY"].endswith("/tls.key")
    spec = pod(
        render(chart, merged(ci_values("ssh"), {"temporal": {"tls": {"clientCertSecret": "c"}}})),
        "Deployment",
    )
    client, inside = mounted_source(
        spec, container(spec, "controller"), mtls["TRAINMEDIC_TEMPORAL_TLS_KEY"]
    )
    assert client["secret"]["secretName"] == "c" and inside == "tls.key"


def test_policy_configmap_is_a_valid_policy_and_rolls_the_pod(chart: Any) -> None:
    values = ci_values("incluster")
    objects = render(chart, values)
    text = one(objects, "ConfigMap")["data"]["policy.yaml"]
    policy = parse_policy(text, "rendered ConfigMap")
    assert policy.version == "site-3"
    assert policy.mode.default is Mode.MONITOR
    assert policy.mode.partitions == {"canary": Mode.APPROVE}
    spec = pod(objects, "Deployment")
    policy_file = plain_env(container(spec, "controller"))["TRAINMEDIC_POLICY_FILE"]
    cm, inside = mounted_source(spec, container(spec, "controller"), policy_file)
    assert cm["configMap"]["name"] == one(objects, "ConfigMap")["metadata"]["name"]
    assert inside == "policy.yaml"

    def checksum(v: Obj) -> str:
        deployment = one(render(chart, v), "Deployment")
        return str(deployment["spec"]["template"]["metadata"]["annotations"]["checksum/policy"])

    changed = merged(values, {"policy": {"version": "site-4", "rails": {"restart_budget": 1}}})
    assert checksum(values) == checksum(copy.deepcopy(values))
    assert checksum(changed) != checksum(values)


def test_an_existing_policy_configmap_is_used_as_it_is(chart: Any) -> None:
    values = merged(ci_values("ssh"), {"existingPolicyConfigMap": "site-policy"})
    objects = render(chart, values)
    assert "ConfigMap" not in {o["kind"] for o in objects}
    assert volume(pod(objects, "Deployment"), "policy")["configMap"]["name"] == "site-policy"


def _model_keys(model: type[BaseModel], schema: Obj, where: str) -> None:
    assert schema.get("additionalProperties") is False, f"{where}: not strict"
    assert set(schema["properties"]) == set(model.model_fields), where
    for name, field in model.model_fields.items():
        inner = field.annotation
        if isinstance(inner, type) and issubclass(inner, BaseModel):
            _model_keys(inner, schema["properties"][name], f"{where}.{name}")


def test_the_schema_mirrors_trainmedics_policy_model(chart: Any) -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    policy = schema["properties"]["policy"]
    _model_keys(Policy, policy, "policy")
    mode = policy["properties"]["mode"]["properties"]
    assert mode["default"]["enum"] == [m.value for m in Mode]
    assert mode["actions"]["propertyNames"]["enum"] == [a.value for a in Action]
    events = schema["properties"]["notify"]["properties"]["events"]["items"]["enum"]
    assert events == [e.value for e in NotifyEvent]
    # And Helm applies it: a policy key trainmedic does not know is refused at install.
    message = schema_error(chart, merged(ci_values("ssh"), {"policy": {"rails": {"max": 1}}}))
    assert "at '/policy/rails': additional properties 'max' not allowed" in message


# ------------------------------------------------------------------------ hardening


@pytest.mark.parametrize("mode", MODES)
def test_pods_are_non_root_read_only_and_without_capabilities(chart: Any, mode: str) -> None:
    objects = render(chart, ci_values(mode))
    for kind in {o["kind"] for o in objects} & {"Deployment", "DaemonSet"}:
        spec = pod(objects, kind)
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert spec["automountServiceAccountToken"] is False
        for c in all_containers(spec):
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True, c["name"]
            assert sc["allowPrivilegeEscalation"] is False, c["name"]
            assert sc["capabilities"]["drop"] == ["ALL"], c["name"]
            assert "add" not in sc["capabilities"], c["name"]
            assert sc["seccompProfile"] == {"type": "RuntimeDefault"}, c["name"]
            assert c["resources"]["requests"] and c["resources"]["limits"]["memory"], c["name"]
    deployment = one(objects, "Deployment")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert one(objects, "ServiceAccount")["automountServiceAccountToken"] is False


# The settings trainmedic itself calls secret (SecretStr): the API key, the webhook URL.
SECRET_SETTINGS = {
    ENV_PREFIX + name.upper()
    for name, field in Settings.model_fields.items()
    if "SecretStr" in str(field.annotation)
}


@pytest.mark.parametrize("mode", MODES)
def test_no_secret_is_ever_inline(chart: Any, mode: str) -> None:
    objects = render(chart, merged(ci_values(mode), EVERYTHING))
    assert "Secret" not in {o["kind"] for o in objects}
    assert {"TRAINMEDIC_TEMPORAL_API_KEY", "TRAINMEDIC_NOTIFY_WEBHOOK_URL"} <= SECRET_SETTINGS
    for o in objects:
        if o["kind"] not in ("Deployment", "DaemonSet"):
            continue
        spec = o["spec"]["template"]["spec"]
        for c in all_containers(spec):
            for name, item in env(c).items():
                if name in SECRET_SETTINGS:
                    assert "secretKeyRef" in item.get("valueFrom", {}), name
        for v in spec["volumes"]:
            if "secret" in v:
                assert set(v["secret"]) <= {"secretName", "defaultMode", "items"}
    # And the values offer no place for one: an inline key is refused.
    message = schema_error(
        chart, merged(ci_values("ssh"), {"temporal": {"apiKey": {"value": "x"}}})
    )
    assert "at '/temporal/apiKey': additional properties 'value' not allowed" in message


# ------------------------------------------------------------------------- node agent


def test_node_agent_daemonset_only_when_enabled(chart: Any) -> None:
    off = merged(ci_values("incluster"), {"nodeAgent": {"enabled": False}})
    assert "DaemonSet" not in {o["kind"] for o in render(chart, off)}

    objects = render(chart, ci_values("incluster"))
    agent_pod = pod(objects, "DaemonSet")
    agent = container(agent_pod, "node-agent")
    assert agent_pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in agent_pod[
        "tolerations"
    ]
    assert agent_pod["runtimeClassName"] == "nvidia"
    assert agent["command"][:3] == ["python", "-m", "trainmedic.workers.node_agent"]
    args = agent["command"][3:]
    flags = dict(zip(args[::2], args[1::2], strict=True))
    assert flags["--node"] == "$(NODE_NAME)"
    assert env(agent)["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert flags["--kernel"] == "journalctl" and flags["--nvml"] == "pynvml"

    # The agents and the controller share one spool directory (shared hostPath).
    controller_pod = pod(objects, "Deployment")
    agent_spool, _ = mounted_source(agent_pod, agent, flags["--spool"] + "/x.json")
    controller_spool, _ = mounted_source(
        controller_pod, container(controller_pod, "controller"), flags["--spool"] + "/x.json"
    )
    assert agent_spool == controller_spool
    assert agent_spool["hostPath"] == {
        "path": "/shared/trainmedic/spool/signals",
        "type": "Directory",
    }
    assert (
        plain_env(container(controller_pod, "controller"))["TRAINMEDIC_STATE_DIR"]
        + ("/spool/signals")
        == flags["--spool"]
    )

    # The journal, read-only, as a member of its group: no capability, no privilege.
    assert agent_pod["securityContext"]["supplementalGroups"] == [101]
    assert mount(agent, "journal")["readOnly"] is True
    assert volume(agent_pod, "journal")["hostPath"]["path"] == "/var/log/journal"
    assert volume(agent_pod, "machine-id")["hostPath"] == {
        "path": "/etc/machine-id",
        "type": "File",
    }
    assert "privileged" not in agent["securityContext"]

    # Signed spool files: the agent signs with the key the controller checks.
    assert (
        install_copies(agent_pod)[plain_env(agent)["TRAINMEDIC_SPOOL_KEY_FILE"]]
        == (
            install_copies(controller_pod)[
                plain_env(container(controller_pod, "controller"))["TRAINMEDIC_SPOOL_KEY_FILE"]
            ]
        )
    )


def test_node_agent_other_kernel_sources(chart: Any) -> None:
    def agent_of(kernel: Obj) -> tuple[Obj, Obj]:
        values = merged(ci_values("incluster"), {"nodeAgent": {"kernel": kernel}})
        spec = pod(render(chart, values), "DaemonSet")
        return spec, container(spec, "node-agent")

    spec, agent = agent_of({"source": "file", "file": "/var/log/kern.log"})
    assert agent["command"][agent["command"].index("--kernel") + 1] == "/var/log/kern.log"
    log_dir, inside = mounted_source(spec, agent, "/var/log/kern.log")
    assert log_dir["hostPath"] == {"path": "/var/log", "type": "Directory"}  # rotation
    assert inside == "kern.log" and mount(agent, "kernel-log")["readOnly"] is True
    assert "supplementalGroups" not in spec["securityContext"]

    values = merged(ci_values("incluster"), {"nodeAgent": {"nvml": "none"}})
    agent = container(pod(render(chart, values), "DaemonSet"), "node-agent")
    assert agent["command"][agent["command"].index("--nvml") + 1] == "none"
    assert "NVIDIA_VISIBLE_DEVICES" not in env(agent)

    spec, agent = agent_of({"source": "kmsg"})
    assert agent["command"][agent["command"].index("--kernel") + 1] == "kmsg"
    assert volume(spec, "kmsg")["hostPath"] == {"path": "/dev/kmsg", "type": "CharDevice"}
    assert agent["securityContext"]["privileged"] is True  # the documented cost of kmsg


# --------------------------------------------------------------- the schema says no


BAD_VALUES = [
    pytest.param(
        "ssh",
        {"slurmAccess": "carrier-pigeon"},
        "at '/slurmAccess': value must be one of 'inCluster', 'ssh'",
        id="unknown-access",
    ),
    pytest.param(
        "ssh",
        {"slurm": {"ssh": {"host": None}}},
        "at '/slurm/ssh': missing property 'host'",
        id="ssh-without-host",
    ),
    pytest.param(
        "ssh",
        {"slurm": {"ssh": {"host": ""}}},
        "at '/slurm/ssh/host': minLength: got 0, want 1",
        id="ssh-empty-host",
    ),
    pytest.param(
        "ssh",
        {"slurm": {"ssh": {"existingSecret": None}}},
        "at '/slurm/ssh': missing property 'existingSecret'",
        id="ssh-without-key-secret",
    ),
    pytest.param(
        "incluster",
        {"slurm": {"inCluster": {"configMap": None}}},
        "at '/slurm/inCluster': missing property 'configMap'",
        id="incluster-without-slurm-conf",
    ),
    pytest.param(
        "incluster",
        {"slurm": {"inCluster": {"mungeKeySecret": None}}},
        "missing property 'mungeKeySecret'",
        id="incluster-without-munge-key",
    ),
    pytest.param(
        "ssh",
        {"slurm": {"ssh": {"port": 70000}}},
        "at '/slurm/ssh/port': maximum: got 70,000, want 65,535",
        id="port-out-of-range",
    ),
    pytest.param(
        "ssh",
        {"cluster": "has space"},
        "at '/cluster': 'has space' does not match pattern",
        id="bad-cluster-name",
    ),
    pytest.param(
        "ssh",
        {"temporal": {"address": "temporal.example"}},
        "at '/temporal/address': 'temporal.example' does not match pattern",
        id="address-no-port",
    ),
    pytest.param(
        "ssh",
        {"controller": {"replicas": 2}},
        "at '/controller/replicas': maximum: got 2, want 1",
        id="two-controllers",
    ),
    pytest.param(
        "ssh",
        {"policy": {"mode": {"default": "yolo"}}},
        "at '/policy/mode/default': value must be one of 'monitor', 'approve', 'auto'",
        id="policy-unknown-mode",
    ),
    pytest.param(
        "ssh",
        {"policy": {"quarantine": {"repeat_offender_incidents": 1}}},
        "at '/policy/quarantine/repeat_offender_incidents': 'not' failed",
        id="quarantine-one",
    ),
    pytest.param(
        "ssh",
        {"notify": {"webhookSecret": "hook", "events": ["lunch"]}},
        "at '/notify/events/0': value must be one of 'approval_needed'",
        id="notify-event",
    ),
    pytest.param(
        "ssh",
        {"slurmAcess": "ssh"},
        "additional properties 'slurmAcess' not allowed",
        id="misspelt-key",
    ),
    pytest.param(
        "ssh",
        {"nodeAgent": {"enabled": True, "kernel": {"journalGid": 101}}},
        "at '/spool/signals/hostPath': minLength: got 0, want 1",
        id="agent-without-spool",
    ),
    pytest.param(
        "incluster",
        {"nodeAgent": {"kernel": {"journalGid": None}}},
        "at '/nodeAgent/kernel/journalGid': got null, want integer",
        id="journal-without-group",
    ),
    pytest.param(
        "incluster",
        {"spool": {"signals": {"existingClaim": "rwx"}}},
        "at '/spool/signals/existingClaim': maxLength: got 3, want 0",
        id="two-spools",
    ),
]


@pytest.mark.parametrize(("mode", "change", "message"), BAD_VALUES)
def test_the_schema_refuses_bad_values_with_helms_message(
    chart: Any, mode: str, change: Obj, message: str
) -> None:
    good = ci_values(mode)
    render(chart, good)  # the same values without the one mistake are fine
    said = schema_error(chart, merged(good, change))
    assert message in said, said


def test_the_chart_defaults_alone_are_refused_naming_what_is_missing(chart: Any) -> None:
    message = schema_error(chart, {})
    assert "at '/cluster': minLength: got 0, want 1" in message
    assert "at '/temporal/address': minLength: got 0, want 1" in message
    # inCluster is the default mode: its ConfigMap and munge key must be named.
    assert "at '/slurm/inCluster/configMap': minLength: got 0, want 1" in message
    assert "at '/slurm/inCluster/mungeKeySecret': minLength: got 0, want 1" in message


def test_notes_say_what_to_do_next(chart: Any) -> None:
    text = notes(chart, ci_values("ssh"))
    assert "slurm@login1.cluster.example:22" in text
    assert f"kubectl -n {NAMESPACE} logs deploy/{RELEASE}-trainmedic-controller" in text
    assert "UNSIGNED" in notes(chart, merged(ci_values("incluster"), {"spool": {"keySecret": ""}}))
