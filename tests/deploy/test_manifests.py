"""Offline checks of the packaging: the Kubernetes manifests (rendered with `kubectl kustomize`,
validated against Kubernetes' own schemas), compose.yaml, nginx.conf and the Dockerfile.

Nothing here starts a container or a cluster; it proves the files are well-formed and say what
docs/replicas.md's "Run several replicas" promises (probes, drain timing, non-root, model pull,
autoscaling).
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from kube import KUBE, ROOT, deployment, doc, env_value, expand, flag, of_kind, pod_labels, pod_spec, render, server, service
KUBERNETES_VERSION = "1.32.0"
CORE_KINDS = {"Deployment", "Service", "PodDisruptionBudget", "PersistentVolumeClaim", "ConfigMap", "NetworkPolicy"}
# Every kind Kubernetes itself defines, checked against its schemas wherever a kustomization has one.
VALIDATED_KINDS = CORE_KINDS | {"ServiceAccount", "Role", "RoleBinding"}
DEFAULT_MODEL = "qwen2.5-coder-0.5b"
KUSTOMIZATIONS = [KUBE / "base"] + sorted(p for p in (KUBE / "overlays").iterdir() if p.is_dir())


def ids(paths):
    return [str(p.relative_to(KUBE)) for p in paths]


@pytest.fixture(scope="module", params=KUSTOMIZATIONS, ids=ids(KUSTOMIZATIONS))
def rendered(request) -> dict[tuple[str, str], dict]:
    """The kustomization's documents by (kind, name)."""
    return render(request.param)


def test_core_kinds_validate_strictly_against_kubernetes_schemas(rendered):
    for kind in CORE_KINDS:
        assert of_kind(rendered, kind), f"no {kind}"
    validated = [d for d in rendered.values() if d["kind"] in VALIDATED_KINDS]
    assert len(validated) >= len(CORE_KINDS)
    for d in validated:
        # Raises on any unknown field, wrong type or missing required field.
        kubernetes_validate.validate(d, KUBERNETES_VERSION, strict=True)


def test_the_schema_check_rejects_a_misspelt_field(rendered):
    broken = yaml.safe_load(yaml.safe_dump(deployment(rendered)))
    broken["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {"httpGet": {"path": "/health/ready", "port": 8080}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def test_probes_readiness_is_ready_liveness_is_live(rendered):
    c = server(rendered)
    assert c["readinessProbe"]["httpGet"]["path"] == "/health/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/health/live"
    assert c["startupProbe"]["httpGet"]["path"] == "/health/live"
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert ports[c[probe]["httpGet"]["port"]] == int(flag(c["args"], "port"))


def test_drain_fits_the_grace_period_and_outlasts_readiness_detection(rendered):
    c = server(rendered)
    drain, grace = int(flag(c["args"], "drain-delay")), int(flag(c["args"], "shutdown-grace"))
    ready = c["readinessProbe"]
    detected = ready["periodSeconds"] * ready["failureThreshold"]
    assert drain > detected, "the replica must refuse new requests until the Service has dropped it"
    assert pod_spec(rendered)["terminationGracePeriodSeconds"] >= drain + grace + 5


def test_runs_as_the_images_non_root_user(rendered):
    pod = pod_spec(rendered)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001
    for c in pod["containers"] + pod["initContainers"]:
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
        assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]


def test_init_container_pulls_the_model_the_server_serves_into_its_volume(rendered):
    pod = pod_spec(rendered)
    (init,) = pod["initContainers"]
    command = [expand(rendered, init, a) for a in init["command"] + init.get("args", [])]
    gantry_args = command[command.index("gantry") + 1 :]
    assert gantry_args[:2] == ["models", "pull"]
    served = env_value(rendered, server(rendered), "GANTRY_MODEL")
    assert gantry_args[2] == served
    (pull_mount,) = [m for m in init["volumeMounts"] if m["mountPath"] == "/models"]
    (models,) = [v for v in pod["volumes"] if v["name"] == pull_mount["name"]]
    doc(rendered, "PersistentVolumeClaim", models["persistentVolumeClaim"]["claimName"])
    assert not pull_mount.get("readOnly", False), "the init container writes the models"
    # The server reads the pulled models where the pull put them (GANTRY_CACHE_DIR/models), and
    # only reads them: a compromised server cannot plant a model for the other replicas.
    (served,) = [m for m in server(rendered)["volumeMounts"] if m["name"] == pull_mount["name"]]
    assert served["readOnly"] is True
    assert served["mountPath"] == "/models/models" and served["subPath"] == "models"


def test_secrets_come_from_a_secret_the_manifests_do_not_hold(rendered):
    c = server(rendered)
    for name in ("GANTRY_DATABASE_URL", "GANTRY_ADMIN_TOKEN"):
        (var,) = [e for e in c["env"] if e["name"] == name]
        assert "value" not in var, f"{name} must not be inline"
        ref = var["valueFrom"]["secretKeyRef"]
        assert ref["name"] == "gantry-secrets" and not ref.get("optional", False), "a missing Secret must stop the pod"
    assert not of_kind(rendered, "Secret"), "no default secret value is committed"
    for path in KUBE.rglob("*.yaml"):
        # Patches (JSON patch lists) are documents too; only mappings are objects.
        docs = [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict)]
        assert not [d for d in docs if d.get("kind") == "Secret"], f"{path} commits a Secret"
    assert "kubectl create secret generic gantry-secrets" in (KUBE / "base" / "kustomization.yaml").read_text()


def test_pods_get_no_service_account_token_and_a_pinned_image(rendered):
    pod = pod_spec(rendered)
    assert pod["automountServiceAccountToken"] is False
    version = re.search(r'^version = "([^"]+)"', (ROOT / "Cargo.toml").read_text(), re.M).group(1)
    for c in pod["containers"] + pod["initContainers"]:
        image = c["image"]
        assert "@sha256:" in image or image.rsplit("/", 1)[-1].partition(":")[2] not in ("", "latest"), image
        assert image == f"gantry:{version}", f"{image}: the image is tagged with the workspace version"


def test_the_admin_port_is_separate_and_not_on_the_service(rendered):
    c = server(rendered)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    admin_listen = flag(c["args"], "admin-listen")
    assert int(admin_listen.rsplit(":", 1)[1]) == ports["admin"] != ports["http"]
    service_ports = service(rendered)["spec"]["ports"]
    assert [p["targetPort"] for p in service_ports] == ["http"]
    assert ports["admin"] not in {p["port"] for p in service_ports}


def test_network_policy_admits_the_api_port_and_lets_out_only_dns_database_and_the_pull(rendered):
    policy = doc(rendered, "NetworkPolicy", "gantry")["spec"]
    labels = pod_labels(rendered)
    assert policy["podSelector"]["matchLabels"].items() <= labels.items()
    assert set(policy["policyTypes"]) == {"Ingress", "Egress"}
    open_ingress = [r for r in policy["ingress"] if not r.get("from")]
    assert [p["port"] for r in open_ingress for p in r["ports"]] == ["http"], "only the API port is open to all"
    container_ports = {p["name"] for p in server(rendered)["ports"]}
    for rule in policy["ingress"]:
        assert rule.get("ports"), "every ingress rule names its ports"
        if rule.get("from"):
            ports = [p["port"] for p in rule["ports"]]
            # The admin port for Prometheus; the metrics listener (--metrics-listen) where there is
            # one, which test_network_policy_admits_only_the_picker_and_prometheus_to_the_metrics
            # checks further.
            assert ports == ["admin"] or ports == ["metrics"] and "metrics" in container_ports, ports
            if ports == ["admin"]:
                assert all("namespaceSelector" in peer for peer in rule["from"])
    egress_ports = {(p["port"], p.get("protocol", "TCP")) for r in policy["egress"] for p in r["ports"]}
    assert egress_ports == {(53, "UDP"), (53, "TCP"), (5432, "TCP"), (443, "TCP")}
    (dns,) = [r for r in policy["egress"] if any(p["port"] == 53 for p in r["ports"])]
    for peer in dns["to"]:
        assert peer["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "kube-system"}
        assert "podSelector" not in peer, "Kustomize would add the app label to it"


def test_memory_is_sized_above_the_model_budget(rendered):
    c = server(rendered)
    units = {"MB": 10**6, "GB": 10**9, "MiB": 2**20, "GiB": 2**30, "Mi": 2**20, "Gi": 2**30}

    def size(text: str) -> int:
        number, unit = re.fullmatch(r"(\d+)([A-Za-z]+)", text).groups()
        return int(number) * units[unit]

    limit = size(c["resources"]["limits"]["memory"])
    assert size(c["resources"]["requests"]["memory"]) == limit
    budget = size(env_value(rendered, c, "GANTRY_MAX_MEMORY"))
    host_cache = int(flag([expand(rendered, c, a) for a in c["args"]], "cache-ram")) << 20
    assert budget + host_cache + 150 * 10**6 <= limit
    threads = int(flag([expand(rendered, c, a) for a in c["args"]], "threads"))
    assert threads == int(c["resources"]["requests"]["cpu"])


def test_service_and_pdb_select_the_deployments_pods(rendered):
    labels = pod_labels(rendered)
    selects = lambda selector: selector.items() <= labels.items()  # noqa: E731
    assert selects(deployment(rendered)["spec"]["selector"]["matchLabels"])
    assert selects(service(rendered)["spec"]["selector"])
    assert selects(doc(rendered, "PodDisruptionBudget", "gantry")["spec"]["selector"]["matchLabels"])
    assert service(rendered)["spec"].get("sessionAffinity", "None") == "None"
    port = service(rendered)["spec"]["ports"][0]
    assert port["targetPort"] in {p["name"] for p in server(rendered)["ports"]}


def test_pod_monitor_scrapes_metrics_from_the_admin_port(rendered):
    pm = doc(rendered, "PodMonitor", "gantry")
    assert pm["apiVersion"] == "monitoring.coreos.com/v1"
    labels = pod_labels(rendered)
    assert pm["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (endpoint,) = pm["spec"]["podMetricsEndpoints"]
    assert endpoint["path"] == "/metrics"
    assert endpoint["port"] == "admin", "/metrics is served on the admin listener only"
    assert "--public-metrics" not in server(rendered)["args"], "the API port does not serve /metrics"
    # The ScaledObject's query selects job="gantry".
    assert {"targetLabel": "job", "replacement": "gantry"} in endpoint["relabelings"]


def test_scaled_object_scales_the_deployment_on_the_waiting_requests(rendered):
    so = doc(rendered, "ScaledObject", "gantry")
    assert so["apiVersion"] == "keda.sh/v1alpha1"
    assert so["spec"]["scaleTargetRef"]["name"] == deployment(rendered)["metadata"]["name"]
    assert 1 <= so["spec"]["minReplicaCount"] <= so["spec"]["maxReplicaCount"]
    (trigger,) = so["spec"]["triggers"]
    assert trigger["type"] == "prometheus"
    # The whole-server gauge: one series per replica whatever its models (gantry_queue_depth is
    # per model).
    assert re.fullmatch(r'sum\(gantry_requests_waiting\{job="gantry"\}\)', trigger["metadata"]["query"]), trigger["metadata"]["query"]
    assert trigger["metadata"]["serverAddress"].startswith("http")
    float(trigger["metadata"]["threshold"])  # KEDA wants a number in a string
    assert isinstance(trigger["metadata"]["threshold"], str)
    # The PDB lets a node drain take one replica at a time even at the minimum.
    assert doc(rendered, "PodDisruptionBudget", "gantry")["spec"]["maxUnavailable"] < so["spec"]["minReplicaCount"]


def test_the_overlay_changes_the_model_and_its_resources():
    docs = render(KUBE / "overlays" / "qwen2.5-coder-1.5b")
    assert env_value(docs, server(docs), "GANTRY_MODEL") == "qwen2.5-coder-1.5b"
    assert server(docs)["resources"]["limits"]["memory"] == "3584Mi"


# compose.yaml


def compose_value(text: str) -> str:
    """Compose's `${VAR:-default}` interpolation, with every variable unset."""
    return re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", text)


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((ROOT / "compose.yaml").read_text())


def replicas(compose) -> dict[str, dict]:
    return {n: s for n, s in compose["services"].items() if s.get("command", [None])[0] == "serve"}


def test_compose_runs_two_replicas_on_postgres_behind_nginx(compose):
    services = compose["services"]
    assert len(replicas(compose)) == 2
    assert services["postgres"]["image"].startswith("docker.io/library/postgres:")
    for name, svc in replicas(compose).items():
        assert svc["environment"]["GANTRY_DATABASE_URL"].startswith("postgres://")
        assert "@postgres:5432/" in svc["environment"]["GANTRY_DATABASE_URL"]
        assert svc["environment"]["GANTRY_INSTANCE_ID"] == name
        assert svc["depends_on"]["postgres"]["condition"] == "service_healthy"
        assert svc["depends_on"]["model-pull"]["condition"] == "service_completed_successfully"
    assert "./deploy/compose/nginx.conf:/etc/nginx/conf.d/default.conf:ro" in services["nginx"]["volumes"]


def test_compose_replicas_probe_ready_and_drain_within_the_stop_grace(compose):
    for svc in replicas(compose).values():
        assert svc["healthcheck"]["test"][-1] == "http://127.0.0.1:8080/health/ready"
        drain, grace = int(flag(svc["command"], "drain-delay")), int(flag(svc["command"], "shutdown-grace"))
        interval = int(svc["healthcheck"]["interval"].rstrip("s"))
        assert drain > interval, "nginx retries a draining replica's 503s; the drain outlasts a probe"
        assert int(svc["stop_grace_period"].rstrip("s")) >= drain + grace + 5


def test_compose_pulls_the_model_the_replicas_serve_into_their_volume(compose):
    pull = compose["services"]["model-pull"]
    assert pull["command"][:2] == ["models", "pull"]
    for svc in replicas(compose).values():
        assert compose_value(pull["command"][2]) == compose_value(svc["environment"]["GANTRY_MODEL"]) == DEFAULT_MODEL
        assert set(pull["volumes"]) == set(svc["volumes"]) == {"models:/models"}


def test_compose_has_no_admin_token_and_keeps_the_admin_listener_off_nginx(compose):
    for svc in replicas(compose).values():
        token = svc["environment"]["GANTRY_ADMIN_TOKEN"]
        # Compose refuses to start while it is unset or empty, with the message after `:?`.
        assert re.fullmatch(r"\$\{GANTRY_ADMIN_TOKEN:\?[^}$]+\}", token), token
        assert flag(svc["command"], "admin-listen") == "0.0.0.0:9090"
        assert all(not p.endswith(":9090") or p.startswith("127.0.0.1:") for p in svc.get("ports", []))
    assert any("127.0.0.1:9090:9090" in svc.get("ports", []) for svc in replicas(compose).values())
    conf = (ROOT / "deploy" / "compose" / "nginx.conf").read_text()
    assert ":9090" not in conf, "nginx proxies the API only"


def test_compose_trusts_its_nginx_which_names_the_client(compose):
    conf = (ROOT / "deploy" / "compose" / "nginx.conf").read_text()
    live = "\n".join(line.split("#", 1)[0] for line in conf.splitlines())
    assert "proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;" in live
    for svc in replicas(compose).values():
        networks = flag(svc["command"], "trusted-proxy").split(",")
        assert all(re.fullmatch(r"(10|172\.16|192\.168)\.[0-9./]+", n) for n in networks), networks
        # Trusting a private range is safe only while the API port is reached through nginx.
        assert not any(p.split(":")[-1] == "8080" for p in svc.get("ports", [])), svc.get("ports")
        assert "--public-metrics" not in svc["command"]


def test_nginx_balances_least_conn_retries_503_and_documents_affinity(compose):
    conf = (ROOT / "deploy" / "compose" / "nginx.conf").read_text()
    live = "\n".join(line.split("#", 1)[0] for line in conf.splitlines())
    assert re.search(r"^\s*least_conn;", live, re.M)
    servers = re.findall(r"^\s*server (\S+):8080 (.*);", live, re.M)
    assert sorted(s for s, _ in servers) == sorted(replicas(compose))
    assert all("max_fails=0" in opts for _, opts in servers)
    assert "proxy_next_upstream error timeout http_503 non_idempotent;" in live
    assert "proxy_buffering off;" in live
    # The prefix-affinity variant: hash the session header, a random key without one.
    assert re.search(r"^\s*#\s*hash \$gantry_affinity consistent;", conf, re.M)
    assert re.search(r"^map \$http_x_session_id \$gantry_affinity \{\s*\"\"\s+\$request_id;\s*default \$http_x_session_id;\s*\}", live, re.M)


# Dockerfile


def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", "\n".join(l for l in (ROOT / "Dockerfile").read_text().splitlines() if not l.lstrip().startswith("#")))
    return [(l.split(None, 1)[0].upper(), l.split(None, 1)[1].strip()) for l in text.splitlines() if l.strip()]


def runtime_stage() -> list[tuple[str, str]]:
    steps = dockerfile()
    last_from = max(i for i, (op, _) in enumerate(steps) if op == "FROM")
    return steps[last_from:]


def test_dockerfile_builds_portably_in_a_separate_stage():
    steps = dockerfile()
    froms = [a for op, a in steps if op == "FROM"]
    assert len(froms) >= 2 and froms[0].endswith(" AS build")
    args = {a.split("=", 1)[0]: a.split("=", 1)[1] for op, a in steps if op == "ARG" and "=" in a}
    assert args["RUNTIME_IMAGE"].endswith("debian:bookworm-slim")
    assert froms[-1] == "${RUNTIME_IMAGE}", "the runtime base is an argument for offline builders"
    (build,) = [a for op, a in steps if op == "RUN" and "cargo build" in a]
    assert "--release" in build and "--locked" in build and "-p gantry-server" in build
    assert "native" not in build
    # One image for every x86-64 host: the CPU variants, picked at start, beside the binary.
    assert "--features gantry-server/cpu-variants" in build and "collect-portable.sh" in build
    assert "$ORIGIN" in build
    assert any(op == "COPY" and a.startswith("--from=build ") for op, a in runtime_stage())


def test_dockerfile_runtime_is_non_root_with_volumes_healthcheck_and_entrypoint():
    steps = runtime_stage()
    ops = dict(steps)  # the last of each instruction wins, as in Docker
    # The uid the Kubernetes securityContext runs as (runAsNonRoot needs a numeric USER).
    assert ops["USER"] == "10001:10001"
    assert set(yaml.safe_load(ops["VOLUME"])) == {"/data", "/models"}
    assert "GANTRY_CACHE_DIR=/models" in ops["ENV"]
    assert ops["EXPOSE"] == "8080"
    assert "/health/ready" in ops["HEALTHCHECK"] and "CMD curl" in ops["HEALTHCHECK"]
    assert any(op == "RUN" and re.search(r"\bcurl\b", a) and "libgomp1" in a and "ca-certificates" in a for op, a in steps)
    assert yaml.safe_load(ops["ENTRYPOINT"]) == ["gantry"]
    cmd = yaml.safe_load(ops["CMD"])
    assert cmd[0] == "serve" and flag(cmd, "host") == "0.0.0.0" and flag(cmd, "port") == "8080"
    assert int(flag(cmd, "drain-delay")) > 0


def test_dockerignore_keeps_build_outputs_and_history_out():
    ignored = set(shlex.split((ROOT / ".dockerignore").read_text(), comments=True))
    assert {"target/", ".git/"} <= ignored


@pytest.mark.parametrize("variant", ["least_conn", "affinity"])
def test_nginx_accepts_the_config_and_its_affinity_variant(variant, tmp_path):
    nginx = shutil.which("nginx") or next((p for p in ["/usr/sbin/nginx"] if Path(p).exists()), None)
    if nginx is None:
        pytest.skip("nginx is not installed: deploy/compose/nginx.conf was not checked by nginx -t")
    conf = (ROOT / "deploy" / "compose" / "nginx.conf").read_text()
    # The compose service names resolve only inside compose's network.
    conf = re.sub(r"server gantry-(\d+):8080", r"server 127.0.0.\1:8080", conf)
    if variant == "affinity":
        conf = re.sub(r"^(\s*)least_conn;", r"\1# least_conn;", conf, flags=re.M)
        conf, swapped = re.subn(r"^(\s*)# hash \$gantry_affinity consistent;", r"\1hash $gantry_affinity consistent;", conf, flags=re.M)
        assert swapped == 1
    (tmp_path / "gantry.conf").write_text(conf)
    (tmp_path / "main.conf").write_text(
        f"pid {tmp_path}/nginx.pid;\nerror_log stderr;\nevents {{}}\nhttp {{\n  access_log off;\n  include {tmp_path}/gantry.conf;\n}}\n"
    )
    result = subprocess.run([nginx, "-t", "-q", "-p", str(tmp_path), "-e", "stderr", "-c", str(tmp_path / "main.conf")], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
