"""deploy/helm/llmgw rendered by Helm's own engine for the default values and each option set:
valid Kubernetes objects (API schemas of KUBERNETES_VERSION), `helm lint --strict` clean, and the
chart's contract with the code (settings it sets are ones llmgw reads, probes, the image's user,
secrets only where they belong, migrations as a hook that upgrades safely)."""

from __future__ import annotations

import re
import shutil
import tomllib
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

from llmgw.config import ENVIRONMENT_VARIABLES
from llmgw.routes import gateway_routes
from tests.deploy.chart import (
    CHART,
    CRD_KINDS,
    DATABASE_VALUES,
    KUBERNETES_VERSION,
    Rendered,
    chart_metadata,
    render,
    validate,
)
from tests.processes import REPO_ROOT
from tests.test_docker_files import final_stage

PROVIDERS_TOML = """\
[[providers]]
name = "openai"
kind = "openai-compatible"
base_url = "https://api.openai.com/v1"
api_key_env = "OPENAI_API_KEY"
"""

SECRET_VALUES = {
    "databaseUrl": "postgresql://llmgw:s3cret-db-password@postgres:5432/llmgw",
    "adminToken": "admin-token-9f2c41d7e3",
    "oidcClientSecret": "oidc-client-secret-3a7d",
    "providerKeys": {"OPENAI_API_KEY": "sk-provider-key-5e1b7a", "VENICE_API_KEY": "vk-4c1d"},
}
REDIS = {"rateLimit": {"backend": "redis", "redisUrl": "redis://:redis-pass-77aa@redis:6379/0"}}
EXISTING = {
    "secrets": {
        "existingSecret": "llmgw-secrets",
        "providerKeyNames": ["OPENAI_API_KEY"],
    },
    "rateLimit": {"backend": "redis"},
    "providersConfig": PROVIDERS_TOML,
}

# Each option the chart has, alone (the database URL is added unless the set is existing-secret).
OPTION_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "ingress": {
        "ingress": {
            "enabled": True,
            "className": "nginx",
            "tls": [{"hosts": ["llmgw.example.com"], "secretName": "llmgw-tls"}],
        }
    },
    "httproute": {
        "httpRoute": {
            "enabled": True,
            "parentRefs": [{"name": "public", "namespace": "gateways"}],
            "hostnames": ["llmgw.example.com"],
        }
    },
    "hpa": {"autoscaling": {"enabled": True, "minReplicas": 3}},
    "no-pdb": {"podDisruptionBudget": {"enabled": False}},
    "servicemonitor": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}},
    "networkpolicy": {
        "networkPolicy": {
            "enabled": True,
            "ingressFrom": [
                {"namespaceSelector": {"matchLabels": {"name": "ingress-nginx"}}},
            ],
        }
    },
    "existing-secret": EXISTING,
    "redis": REDIS,
    "migrations-off": {"migrations": {"enabled": False}},
    "providers-and-secrets": {
        "providersConfig": PROVIDERS_TOML,
        "secrets": SECRET_VALUES,
        "config": {
            "LOG_LEVEL": "DEBUG",
            "LLMGW_WORKERS": 2,
            "TRUST_FORWARDED_HEADERS": True,
            "OIDC_ISSUER": "https://sso.example.com/realms/acme",
            "OIDC_CLIENT_ID": "llmgw",
        },
    },
    "no-service-account": {"serviceAccount": {"create": False}},
}


def render_set(name: str) -> Rendered:
    return render(OPTION_SETS[name], database=name != "existing-secret")


@pytest.fixture(scope="module")
def rendered() -> dict[str, Rendered]:
    return {name: render_set(name) for name in OPTION_SETS}


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {entry["name"]: entry for entry in container.get("env", [])}


def pod_specs(release: Rendered) -> list[dict[str, Any]]:
    return [
        o["spec"]["template"]["spec"] for o in release.objects if o["kind"] in ("Deployment", "Job")
    ]


# ---- valid objects, lint, schema ---------------------------------------------------------------


@pytest.mark.parametrize("option_set", OPTION_SETS)
def test_every_object_is_valid_for_kubernetes(rendered: dict[str, Rendered], option_set: str):
    release = rendered[option_set]
    assert release.objects
    assert list(validate(release.objects)) == []
    names = [(o["kind"], o["metadata"]["name"]) for o in release.objects]
    assert len(names) == len(set(names)), names


def test_the_validation_catches_an_invalid_object(rendered: dict[str, Rendered]) -> None:
    broken = yaml.safe_load(yaml.safe_dump(rendered["defaults"].deployment))
    broken["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "http"
    broken["spec"]["replicas"] = "two"
    problems = list(validate([broken]))
    assert problems and "Deployment/demo-llmgw" in problems[0]


def test_each_option_set_makes_its_objects(rendered: dict[str, Rendered]) -> None:
    base = {
        "Deployment",
        "Job",
        "PodDisruptionBudget",
        "Secret",
        "Service",
        "ServiceAccount",
    }
    assert set(rendered["defaults"].kinds()) == base
    assert set(rendered["ingress"].kinds()) == base | {"Ingress"}
    assert set(rendered["httproute"].kinds()) == base | {"HTTPRoute"}
    assert set(rendered["hpa"].kinds()) == base | {"HorizontalPodAutoscaler"}
    assert set(rendered["no-pdb"].kinds()) == base - {"PodDisruptionBudget"}
    assert set(rendered["servicemonitor"].kinds()) == base | {"ServiceMonitor"}
    assert set(rendered["networkpolicy"].kinds()) == base | {"NetworkPolicy"}
    assert set(rendered["existing-secret"].kinds()) == base - {"Secret"} | {"ConfigMap"}
    assert set(rendered["migrations-off"].kinds()) == base - {"Job"}
    assert set(rendered["no-service-account"].kinds()) == base - {"ServiceAccount"}


@pytest.mark.parametrize(
    "option_set", [None, "defaults", "existing-secret", "providers-and-secrets"]
)
def test_helm_lint_strict_reports_nothing(option_set: str | None) -> None:
    # None: `helm lint --strict deploy/helm/llmgw` as is, no values given.
    values = OPTION_SETS[option_set] if option_set else None
    if option_set not in (None, "existing-secret"):
        assert values is not None
        values = {**values, "secrets": {**DATABASE_VALUES["secrets"], **values.get("secrets", {})}}
    report = helm.lint(CHART, values, strict=True, kube_version=f"v{KUBERNETES_VERSION}")
    assert report["messages"] == [] and report["errors"] == [], report


def test_helm_lint_strict_reports_what_it_finds(tmp_path: Path) -> None:
    # The lint above is live: the chart without its icon, and with a template Kubernetes would
    # refuse, is reported.
    copy = tmp_path / "llmgw"
    shutil.copytree(CHART, copy)
    metadata = (copy / "Chart.yaml").read_text()
    (copy / "Chart.yaml").write_text(re.sub(r"^icon: .*$", "", metadata, flags=re.M))
    (copy / "templates" / "broken.yaml").write_text("apiVersion: v1\nkind: Service\nmetadata: {}\n")
    report = helm.lint(copy, DATABASE_VALUES, strict=True)
    found = " ".join(m["error"] for m in report["messages"]) + " ".join(report["errors"])
    assert "icon is recommended" in found
    assert "object name does not conform" in found


def test_rendering_without_a_database_fails_saying_what_to_set() -> None:
    with pytest.raises(helm.HelmRenderError) as failure:
        render({}, database=False)
    message = str(failure.value)
    assert "secrets.databaseUrl" in message and "secrets.existingSecret" in message
    assert "embedded" in message


@pytest.mark.parametrize(
    ("values", "says"),
    [
        ({"replicaCount": 0}, "/replicaCount"),
        ({"config": {"DATABASE_URL": "postgresql://x"}}, "DATABASE_URL"),
        ({"config": {"BIND_ADDR": "0.0.0.0:1"}}, "BIND_ADDR"),
        ({"config": {"NOT_A_SETTING": "1"}}, "NOT_A_SETTING"),
        ({"secrets": {"databaseUrl": "mysql://db/x"}}, "/secrets/databaseUrl"),
        ({"rateLimit": {"backend": "memcached"}}, "/rateLimit/backend"),
        ({"imageTag": "1.0"}, "imageTag"),
        ({"shutdown": {"graceSeconds": -1}}, "/shutdown/graceSeconds"),
        ({"httpRoute": {"timeouts": {"request": "an hour"}}}, "/httpRoute/timeouts/request"),
    ],
)
def test_the_values_schema_rejects_wrong_values_naming_them(
    values: dict[str, Any], says: str
) -> None:
    with pytest.raises(helm.HelmError) as failure:
        render(values)
    assert says in str(failure.value)


@pytest.mark.parametrize(
    ("values", "says"),
    [
        (
            {"shutdown": {"terminationGracePeriodSeconds": 130}},
            "must exceed shutdown.graceSeconds + shutdown.preStopSeconds (130)",
        ),
        ({"rateLimit": {"backend": "redis"}}, "rateLimit.redisUrl"),
        ({"httpRoute": {"enabled": True}}, "httpRoute.parentRefs"),
        (
            {"secrets": {"existingSecret": "mine", "adminToken": "t"}},
            "secret values stay in that Secret",
        ),
    ],
)
def test_rendering_refuses_what_would_not_work(values: dict[str, Any], says: str) -> None:
    with pytest.raises(helm.HelmRenderError) as failure:
        render(values)
    assert says in str(failure.value)


def test_chart_metadata_names_the_package_version() -> None:
    metadata = chart_metadata()
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    assert metadata["apiVersion"] == "v2"
    assert metadata["appVersion"] == pyproject["project"]["version"]


def test_the_image_tag_defaults_to_app_version(rendered: dict[str, Rendered]) -> None:
    app_version = chart_metadata()["appVersion"]
    for spec in pod_specs(rendered["defaults"]):
        assert spec["containers"][0]["image"] == f"llmgw:{app_version}"
    tagged = render({"image": {"repository": "registry.example/llmgw", "tag": "abc"}})
    assert tagged.gateway["image"] == "registry.example/llmgw:abc"


def test_notes_say_how_to_reach_the_gateway(rendered: dict[str, Rendered]) -> None:
    assert "port-forward service/demo-llmgw" in rendered["defaults"].notes
    assert "https://llmgw.example.com/v1/models" in rendered["ingress"].notes
    assert "llmgw db upgrade" in rendered["migrations-off"].notes


# ---- the contract with llmgw --------------------------------------------------------------------

DOCUMENTED = set(
    re.findall(
        r"^\| `([A-Z][A-Z0-9_]+)` \|",
        (REPO_ROOT / "docs" / "configuration.md").read_text(),
        re.M,
    )
)
READ = {var.name for var in ENVIRONMENT_VARIABLES}


def provider_key_names(release: Rendered) -> set[str]:
    """The api_key_env names of the providers file the chart mounts: llmgw reads those too."""
    config_maps = release.all("ConfigMap")
    if not config_maps:
        return set()
    providers = tomllib.loads(config_maps[0]["data"]["providers.toml"])["providers"]
    return {p["api_key_env"] for p in providers if "api_key_env" in p}


@pytest.mark.parametrize("option_set", OPTION_SETS)
def test_every_variable_the_chart_sets_is_one_llmgw_reads_and_documents(
    rendered: dict[str, Rendered], option_set: str
) -> None:
    release = rendered[option_set]
    for spec in pod_specs(release):
        for name in env_of(spec["containers"][0]):
            if name in provider_key_names(release) or name == "VENICE_API_KEY":
                continue  # a provider's key: named by the providers file, or venice's default
            assert name in READ, f"{name} is not in llmgw/config.py's ENVIRONMENT_VARIABLES"
            assert name in DOCUMENTED, f"{name} is not in docs/configuration.md's table"


def chart_owned() -> set[str]:
    """What the chart sets itself from its own values, under any option set."""
    owned: set[str] = set()
    for name in ("servicemonitor", "redis", "providers-and-secrets", "existing-secret"):
        owned |= set(env_of(render_set(name).gateway))
    return owned - set(OPTION_SETS["providers-and-secrets"]["config"])


def test_the_config_value_takes_exactly_the_settings_the_chart_leaves_to_you() -> None:
    schema = yaml.safe_load((CHART / "values.schema.json").read_text())
    allowed = set(schema["properties"]["config"]["propertyNames"]["enum"])
    secret = {var.name for var in ENVIRONMENT_VARIABLES if var.secret}
    assert allowed == READ - secret - chart_owned()


def test_probes_ask_the_liveness_and_readiness_routes_on_the_listening_port(
    rendered: dict[str, Rendered],
) -> None:
    docs = {route.path: route.doc.operation_id for route in gateway_routes()}
    assert docs["/healthz"] == "healthz" and docs["/readyz"] == "readyz"
    container = rendered["defaults"].gateway
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    bind_port = int(env_of(container)["BIND_ADDR"]["value"].rpartition(":")[2])
    assert ports == {"http": bind_port}
    # A database outage must not restart every pod: startup and liveness never ask /readyz.
    assert container["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    service = rendered["defaults"].one("Service")
    assert service["spec"]["ports"][0]["targetPort"] == "http"


@pytest.mark.parametrize(
    "shutdown",
    [{}, {"graceSeconds": 600, "preStopSeconds": 15}, {"terminationGracePeriodSeconds": 200}],
)
def test_streams_finish_before_the_pod_is_killed(shutdown: dict[str, int]) -> None:
    release = render({"shutdown": shutdown})
    spec = release.deployment["spec"]["template"]["spec"]
    container = spec["containers"][0]
    grace = int(env_of(container)["SHUTDOWN_GRACE_SECONDS"]["value"])
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep"
    assert spec["terminationGracePeriodSeconds"] > grace + int(command[1])


def security_contexts(spec: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    return spec["securityContext"], spec["containers"][0]["securityContext"]


def image_user() -> int:
    users = [i.args for i in final_stage() if i.keyword == "USER"]
    return int(users[-1].split(":")[0])


@pytest.mark.parametrize("option_set", ["defaults", "providers-and-secrets"])
def test_gateway_and_migration_pods_meet_the_restricted_pod_security_standard(
    rendered: dict[str, Rendered], option_set: str
) -> None:
    release = rendered[option_set]
    specs = pod_specs(release)
    assert len(specs) == 2
    for spec in specs:
        pod, container = security_contexts(spec)
        assert pod["runAsNonRoot"] is True and container["runAsNonRoot"] is True
        assert pod["runAsUser"] == container["runAsUser"] == image_user()
        assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
        assert container["seccompProfile"] == {"type": "RuntimeDefault"}
        assert container["allowPrivilegeEscalation"] is False
        assert container["readOnlyRootFilesystem"] is True
        assert container["capabilities"] == {"drop": ["ALL"]}
        assert spec["automountServiceAccountToken"] is False
        for volume in spec["volumes"]:
            assert set(volume) - {"name"} <= {"emptyDir", "configMap"}, volume
    # The gateway writes only to emptyDirs: /tmp and LLMGW_DATA_DIR (the ledger's spool).
    gateway = release.deployment["spec"]["template"]["spec"]
    kinds = {v["name"]: next(k for k in v if k != "name") for v in gateway["volumes"]}
    writable = {
        m["mountPath"]
        for m in gateway["containers"][0]["volumeMounts"]
        if not m.get("readOnly") and kinds[m["name"]] == "emptyDir"
    }
    assert writable == {"/tmp", env_of(gateway["containers"][0])["LLMGW_DATA_DIR"]["value"]}


def test_pods_spread_across_nodes(rendered: dict[str, Rendered]) -> None:
    spec = rendered["defaults"].deployment["spec"]["template"]["spec"]
    (spread,) = spec["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname"
    labels = rendered["defaults"].deployment["spec"]["selector"]["matchLabels"]
    assert spread["labelSelector"]["matchLabels"] == labels


def test_the_image_carries_the_redis_and_cloud_extras_and_runs_as_the_chart_user(
    rendered: dict[str, Rendered],
) -> None:
    runs = " ".join(i.args for i in final_stage() if i.keyword == "RUN")
    assert "[speed,redis,bedrock,vertex]" in runs
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["runAsUser"] == image_user()
    # The data directory the image makes (owned by its user) is the one the chart mounts writable.
    image_env = " ".join(i.args for i in final_stage() if i.keyword == "ENV")
    data_dir = env_of(rendered["defaults"].gateway)["LLMGW_DATA_DIR"]["value"]
    assert f"LLMGW_DATA_DIR={data_dir}" in image_env
    assert re.search(rf"install -d -o llmgw -g llmgw -m 0750 {data_dir}\b", runs)


def test_the_image_carries_oci_labels_with_the_package_version() -> None:
    labels = " ".join(i.args for i in final_stage() if i.keyword == "LABEL")
    args = dict(i.args.split("=", 1) for i in final_stage() if i.keyword == "ARG" and "=" in i.args)
    version = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert args["LLMGW_VERSION"] == version
    for key in ("title", "description", "version", "licenses"):
        assert f"org.opencontainers.image.{key}=" in labels, key
    assert 'org.opencontainers.image.version="${LLMGW_VERSION}"' in labels


def test_redis_limit_store_sets_the_backend_and_the_url_from_the_secret(
    rendered: dict[str, Rendered],
) -> None:
    env = env_of(rendered["redis"].gateway)
    assert env["RATE_LIMIT_BACKEND"]["value"] == "redis"
    assert env["REDIS_URL"]["valueFrom"]["secretKeyRef"] == {
        "name": "demo-llmgw",
        "key": "REDIS_URL",
    }
    secret = rendered["redis"].one("Secret")
    assert secret["stringData"]["REDIS_URL"] == REDIS["rateLimit"]["redisUrl"]
    assert env_of(rendered["defaults"].gateway)["RATE_LIMIT_BACKEND"]["value"] == "postgres"
    assert "REDIS_URL" not in env_of(rendered["defaults"].gateway)


def test_the_service_monitor_turns_on_prometheus(rendered: dict[str, Rendered]) -> None:
    assert "LLMGW_PROMETHEUS" not in env_of(rendered["defaults"].gateway)
    release = rendered["servicemonitor"]
    assert env_of(release.gateway)["LLMGW_PROMETHEUS"]["value"] == "true"
    monitor = release.one("ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["endpoints"][0]["port"] == "http"
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"
    assert any(route.path == "/metrics" for route in gateway_routes())
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["selector"]["matchLabels"] == release.one("Service")["spec"]["selector"]


def test_the_http_route_and_ingress_keep_streams_open(rendered: dict[str, Rendered]) -> None:
    route = rendered["httproute"].one("HTTPRoute")
    assert route["apiVersion"] == "gateway.networking.k8s.io/v1"
    (rule,) = route["spec"]["rules"]
    assert rule["backendRefs"] == [{"name": "demo-llmgw", "port": 80}]
    assert rule["timeouts"] == {"request": "3600s", "backendRequest": "3600s"}
    assert route["spec"]["parentRefs"] == [{"name": "public", "namespace": "gateways"}]
    ingress = rendered["ingress"].one("Ingress")
    annotations = ingress["metadata"]["annotations"]
    assert annotations["nginx.ingress.kubernetes.io/proxy-buffering"] == "off"
    assert int(annotations["nginx.ingress.kubernetes.io/proxy-read-timeout"]) >= 600
    assert ingress["spec"]["ingressClassName"] == "nginx"


def test_the_network_policy_admits_only_the_named_peers_to_the_port(
    rendered: dict[str, Rendered],
) -> None:
    policy = rendered["networkpolicy"].one("NetworkPolicy")
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"port": "http", "protocol": "TCP"}]
    assert rule["from"] == OPTION_SETS["networkpolicy"]["networkPolicy"]["ingressFrom"]


def test_autoscaling_leaves_replicas_to_the_autoscaler(rendered: dict[str, Rendered]) -> None:
    assert "replicas" not in rendered["hpa"].deployment["spec"]
    hpa = rendered["hpa"].one("HorizontalPodAutoscaler")
    assert hpa["spec"]["minReplicas"] == 3
    assert hpa["spec"]["scaleTargetRef"]["name"] == rendered["hpa"].deployment["metadata"]["name"]
    assert rendered["defaults"].deployment["spec"]["replicas"] == 2


# ---- secrets -------------------------------------------------------------------------------------


def secret_values() -> list[str]:
    return [
        SECRET_VALUES["databaseUrl"],
        SECRET_VALUES["adminToken"],
        SECRET_VALUES["oidcClientSecret"],
        *SECRET_VALUES["providerKeys"].values(),
        REDIS["rateLimit"]["redisUrl"],
    ]


def test_with_an_existing_secret_no_manifest_holds_a_secret_value(
    rendered: dict[str, Rendered],
) -> None:
    release = rendered["existing-secret"]
    assert release.all("Secret") == []
    for value in secret_values():
        assert value not in release.text()
    for spec in pod_specs(release):
        env = env_of(spec["containers"][0])
        for name in ("DATABASE_URL", "LLMGW_ADMIN_TOKEN", "REDIS_URL", "OPENAI_API_KEY"):
            if name not in env:
                assert spec["containers"][0]["name"] == "migrate"
                continue
            assert "value" not in env[name]
            assert env[name]["valueFrom"]["secretKeyRef"]["name"] == "llmgw-secrets"
            assert env[name]["valueFrom"]["secretKeyRef"]["key"] == name
    gateway_env = env_of(release.gateway)
    assert gateway_env["LLMGW_ADMIN_TOKEN"]["valueFrom"]["secretKeyRef"]["optional"] is True
    assert env_of(release.job["spec"]["template"]["spec"]["containers"][0]).keys() == {
        "DATABASE_URL"
    }


def test_the_chart_made_secret_holds_the_secrets_and_nothing_else_does(
    rendered: dict[str, Rendered],
) -> None:
    release = rendered["providers-and-secrets"]
    secret = release.one("Secret")
    assert secret["stringData"] == {
        "DATABASE_URL": SECRET_VALUES["databaseUrl"],
        "LLMGW_ADMIN_TOKEN": SECRET_VALUES["adminToken"],
        "OIDC_CLIENT_SECRET": SECRET_VALUES["oidcClientSecret"],
        **SECRET_VALUES["providerKeys"],
    }
    others = [o for o in release.objects if o["kind"] != "Secret"]
    dumped = yaml.safe_dump(others) + release.notes
    for value in secret_values():
        assert value not in dumped
    env = env_of(release.gateway)
    for name in secret["stringData"]:
        assert env[name]["valueFrom"]["secretKeyRef"] == {"name": "demo-llmgw", "key": name}


def test_a_change_of_config_or_secret_rolls_the_pods() -> None:
    def annotations(values: dict[str, Any]) -> dict[str, str]:
        metadata = render(values).deployment["spec"]["template"]["metadata"]
        return dict(metadata["annotations"])

    base = annotations({"providersConfig": PROVIDERS_TOML})
    other_config = annotations({"providersConfig": PROVIDERS_TOML + "max_retries = 3\n"})
    other_secret = annotations(
        {"providersConfig": PROVIDERS_TOML, "secrets": {"adminToken": "rotated"}}
    )
    assert base["checksum/config"] != other_config["checksum/config"]
    assert base["checksum/secret"] == other_config["checksum/secret"]
    assert base["checksum/secret"] != other_secret["checksum/secret"]


@pytest.mark.parametrize(
    ("value", "text"),
    [(33554432, "33554432"), (1.5, "1.5"), (True, "true"), ("auto", "auto"), (0, "0")],
)
def test_config_values_reach_the_environment_as_llmgw_parses_them(value: Any, text: str) -> None:
    release = render(
        {"config": {"REQUEST_BODY_LIMIT_BYTES": value}, "shutdown": {"graceSeconds": 10000000}}
    )
    env = env_of(release.gateway)
    assert env["REQUEST_BODY_LIMIT_BYTES"]["value"] == text
    assert env["SHUTDOWN_GRACE_SECONDS"]["value"] == "10000000"
    assert release.gateway["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "10"]


def test_the_providers_file_is_mounted_where_llmgw_config_points(
    rendered: dict[str, Rendered],
) -> None:
    release = rendered["providers-and-secrets"]
    env = env_of(release.gateway)
    path = env["LLMGW_CONFIG"]["value"]
    (mount,) = [m for m in release.gateway["volumeMounts"] if m["name"] == "config"]
    assert path == f"{mount['mountPath']}/providers.toml"
    config_map = release.one("ConfigMap")
    assert config_map["data"]["providers.toml"].strip() == PROVIDERS_TOML.strip()
    assert env["LOG_LEVEL"]["value"] == "DEBUG" and env["LLMGW_WORKERS"]["value"] == "2"
    assert "LLMGW_CONFIG" not in env_of(rendered["defaults"].gateway)


# ---- migrations ----------------------------------------------------------------------------------


def hook(obj: dict[str, Any]) -> dict[str, str]:
    annotations: dict[str, str] = obj["metadata"].get("annotations") or {}
    return {k: v for k, v in annotations.items() if k.startswith("helm.sh/hook")}


def test_migrations_run_as_a_pre_install_and_pre_upgrade_hook(
    rendered: dict[str, Rendered],
) -> None:
    release = rendered["defaults"]
    job = release.job
    assert hook(job)["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert hook(job)["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
    assert job["spec"]["backoffLimit"] >= 0
    assert job["spec"]["activeDeadlineSeconds"] > 0
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    command = pod["containers"][0]["command"]
    assert command[:5] == ["python", "-m", "llmgw", "db", "upgrade"]
    assert "--wait-for-database" in command
    assert pod["serviceAccountName"] == release.one("ServiceAccount")["metadata"]["name"]


@pytest.mark.parametrize("option_set", ["defaults", "providers-and-secrets", "redis"])
def test_what_the_job_uses_exists_before_it_and_stays_after(
    rendered: dict[str, Rendered], option_set: str
) -> None:
    # On a first install hooks run before the ordinary objects exist: the Job's Secret and
    # ServiceAccount are hooks of a lower weight, not deleted when the hooks succeed (the
    # Deployment uses them too).
    release = rendered[option_set]
    job_weight = int(hook(release.job)["helm.sh/hook-weight"])
    pod = release.job["spec"]["template"]["spec"]
    used = {("ServiceAccount", pod["serviceAccountName"])}
    for entry in pod["containers"][0]["env"]:
        if "valueFrom" in entry:
            used.add(("Secret", entry["valueFrom"]["secretKeyRef"]["name"]))
    for kind, name in used:
        (obj,) = [o for o in release.all(kind) if o["metadata"]["name"] == name]
        annotations = hook(obj)
        assert annotations["helm.sh/hook"] == "pre-install,pre-upgrade", (kind, name)
        assert int(annotations["helm.sh/hook-weight"]) < job_weight
        assert "hook-succeeded" not in annotations["helm.sh/hook-delete-policy"]
    # Nothing else is a hook: the Deployment and the rest are applied after the Job succeeded.
    hooks = {o["kind"] for o in release.objects if hook(o)}
    assert hooks == {"Job", "Secret", "ServiceAccount"}


def test_with_migrations_off_nothing_is_a_hook(rendered: dict[str, Rendered]) -> None:
    release = rendered["migrations-off"]
    assert release.all("Job") == []
    assert [o["kind"] for o in release.objects if hook(o)] == []


def test_crd_objects_name_their_api(rendered: dict[str, Rendered]) -> None:
    for release in rendered.values():
        for obj in release.objects:
            if obj["kind"] in CRD_KINDS:
                assert obj["apiVersion"] in {
                    "gateway.networking.k8s.io/v1",
                    "monitoring.coreos.com/v1",
                }
                assert obj["metadata"]["name"] == "demo-llmgw"


def test_a_rolling_update_keeps_every_replica_serving(rendered: dict[str, Rendered]) -> None:
    strategy = rendered["defaults"].deployment["spec"]["strategy"]
    assert strategy == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
