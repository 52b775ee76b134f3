"""Offline checks of the inference-gateway overlay (deploy/kubernetes/overlays/inference-gateway):
the InferencePool selects the Gantry pods on their serving port, names the endpoint picker's
Service, the picker's configuration reads gauges the server really exports given its args, the
HTTPRoute sends to the pool, the NetworkPolicy and RBAC let the picker do exactly its job.
Rendered with `kubectl kustomize` (skipped, and reported, without kubectl); the gateway's own CRDs
are checked by structure, as no schema for them is at hand offline."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from kube import KUBE, ROOT, doc, flag, of_kind, pod_labels, pod_spec, render, server, service


GATEWAY = KUBE / "overlays" / "inference-gateway"
SERVER_GAUGES = ROOT / "crates" / "server" / "src" / "telemetry" / "server_gauges.rs"


@pytest.fixture(scope="module")
def gateway() -> dict[tuple[str, str], dict]:
    return render(GATEWAY)


def exported_gauges(args: list[str]) -> dict[str, set[str]]:
    """The whole-server gauges Gantry serves with these args, and each one's label names, read
    from the code that writes them (vLLM's names only under `--metrics-compat vllm`)."""
    source = SERVER_GAUGES.read_text()
    names = re.findall(r'gauge\(\s*"([a-z_:]+)"', source)
    assert {"gantry_requests_waiting", "gantry_requests_running", "gantry_kv_cache_utilization", "gantry_kv_cache_info"} <= set(names), names
    labels = {n: set() for n in names}
    # `gauge(NAME, HELP, &VAR, value)` takes its labels from the latest `let VAR = format!("{{a=\"…\",…}}"`.
    for call in re.finditer(r'gauge\(\s*"([a-z_:]+)",(?:\s*"(?:[^"\\]|\\.)*")+,\s*&(\w+),', source):
        lets = list(re.finditer(rf'let {call.group(2)} = format!\(\s*"((?:[^"\\]|\\.)*)"', source[: call.start()]))
        assert lets, f"{call.group(1)}: no labels for &{call.group(2)}"
        labels[call.group(1)] = set(re.findall(r'(\w+)=\\"', lets[-1].group(1)))
    compat = " ".join(args).replace("=", " ")
    vllm = re.search(r"--metrics-compat vllm\b", compat) is not None
    return {n: l for n, l in labels.items() if vllm or not n.startswith("vllm:")}


def kv_block_tokens() -> int:
    return int(re.search(r"const KV_BLOCK_TOKENS: u64 = (\d+);", SERVER_GAUGES.read_text()).group(1))


def metric_name(spec: str) -> str:
    """The family a picker metric spec reads: `name` or `name{label=value,...}`."""
    return re.fullmatch(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?", spec).group(1)


def picker(gateway) -> dict:
    return doc(gateway, "Deployment", "gantry-endpoint-picker")


def picker_container(gateway) -> dict:
    (c,) = picker(gateway)["spec"]["template"]["spec"]["containers"]
    return c


def picker_config(gateway) -> dict:
    """The EndpointPickerConfig the picker's --config-file names, from the ConfigMap mounted there."""
    c = picker_container(gateway)
    path = Path(flag(c["args"], "config-file"))
    (mount,) = [m for m in c["volumeMounts"] if Path(m["mountPath"]) == path.parent]
    (volume,) = [v for v in picker(gateway)["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"]]
    cm = doc(gateway, "ConfigMap", volume["configMap"]["name"])
    return yaml.safe_load(cm["data"][path.name])


def plugins(config: dict) -> dict[str, dict]:
    """The configured plugins by name (a plugin without one is named after its type)."""
    return {p.get("name", p["type"]): p for p in config["plugins"]}


def engine_mapping(gateway, config: dict) -> dict:
    """The core-metrics-extractor's metric specs for the Gantry pods: the engine their label
    names (or the default engine for unlabelled pods)."""
    (extractor,) = [p for p in config["plugins"] if p["type"] == "core-metrics-extractor"]
    params = extractor.get("parameters", {})
    key = params.get("engineLabelKey", "llm-d.ai/engine-type")
    engine = pod_labels(gateway).get(key, params.get("defaultEngine", "vllm"))
    assert engine == params.get("defaultEngine"), "unlabelled Gantry pods read the same names"
    configured = {e["name"]: e for e in params.get("engineConfigs", [])}
    if engine in configured:
        return configured[engine]
    # The picker's built-in vLLM mapping (factories.go's defaultEngineConfigs).
    assert engine == "vllm", f"engine {engine!r} has no engineConfigs entry and is not built in"
    return {"queuedRequestsSpec": "vllm:num_requests_waiting", "runningRequestsSpec": "vllm:num_requests_running",
            "kvUsageSpec": "vllm:kv_cache_usage_perc", "loraSpec": "vllm:lora_requests_info", "cacheInfoSpec": "vllm:cache_config_info"}


def unexported_specs(mapping: dict, args: list[str]) -> list[str]:
    """The specs of a mapping that name a gauge, or a label, the server does not export."""
    gauges = exported_gauges(args)
    missing = []
    for field in ("queuedRequestsSpec", "runningRequestsSpec", "kvUsageSpec", "cacheInfoSpec"):
        spec = mapping.get(field, "")
        if metric_name(spec) not in gauges:
            missing.append(f"{field}: {spec}")
    info = metric_name(mapping["cacheInfoSpec"])
    for field, default in (("cacheBlockSizeLabelName", "block_size"), ("cacheNumBlocksLabelName", "num_gpu_blocks")):
        if mapping.get(field, default) not in gauges.get(info, set()):
            missing.append(f"{field}: {mapping.get(field, default)} on {info}")
    return missing


def test_the_pool_selects_the_gantry_pods_on_their_serving_port(gateway):
    pool = doc(gateway, "InferencePool", "gantry")
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    selector = pool["spec"]["selector"]["matchLabels"]
    assert selector and selector.items() <= pod_labels(gateway).items()
    # Exactly the Gantry pods: the picker's own pods (same namespace) must not match.
    assert not selector.items() <= picker(gateway)["spec"]["template"]["metadata"]["labels"].items()
    assert selector == service(gateway)["spec"]["selector"], "the pool and the Service serve the same pods"
    c = server(gateway)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert pool["spec"]["targetPorts"] == [{"number": int(flag(c["args"], "port"))}]
    assert pool["spec"]["targetPorts"][0]["number"] == ports["http"]


def test_the_pool_names_the_picker_service_and_its_ext_proc_port(gateway):
    ref = doc(gateway, "InferencePool", "gantry")["spec"]["endpointPickerRef"]
    assert ref.get("kind", "Service") == "Service" and ref.get("group", "") == ""
    assert ref["failureMode"] == "FailClose"
    svc = doc(gateway, "Service", ref["name"])
    (port,) = [p for p in svc["spec"]["ports"] if p["port"] == ref["port"]["number"]]
    labels = picker(gateway)["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= labels.items()
    assert picker(gateway)["spec"]["selector"]["matchLabels"].items() <= labels.items()
    c = picker_container(gateway)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    target = ports[port["targetPort"]] if isinstance(port["targetPort"], str) else port["targetPort"]
    assert target == int(flag(c["args"], "grpc-port"))
    health = int(flag(c["args"], "grpc-health-port"))
    for probe in ("readinessProbe", "livenessProbe"):
        assert c[probe]["grpc"]["port"] == health != target


def test_the_picker_runs_a_pinned_image_unprivileged_for_this_pool(gateway):
    c = picker_container(gateway)
    assert flag(c["args"], "pool-name") == doc(gateway, "InferencePool", "gantry")["metadata"]["name"]
    assert flag(c["args"], "pool-group") == "inference.networking.k8s.io"
    # Without --pool-namespace the picker watches the namespace in NAMESPACE: its own.
    (ns,) = [e for e in c["env"] if e["name"] == "NAMESPACE"]
    assert ns["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert re.fullmatch(r"registry\.k8s\.io/gateway-api-inference-extension/epp:v\d+\.\d+\.\d+", c["image"]), c["image"]
    pod = picker(gateway)["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]


def test_the_picker_scrapes_the_metrics_listener_not_the_api_port(gateway):
    c = server(gateway)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    listen = flag(c["args"], "metrics-listen")
    assert listen.rsplit(":", 1)[0] == "0.0.0.0", "the picker reaches the pod's IP"
    assert int(listen.rsplit(":", 1)[1]) == ports["metrics"]
    assert len(set(ports.values())) == len(ports), "the API, admin and metrics listeners are separate"
    assert int(flag(picker_container(gateway)["args"], "model-server-metrics-port")) == ports["metrics"]
    source = plugins(picker_config(gateway))["metrics-data-source"]
    assert source["parameters"]["path"] == "/metrics" and source["parameters"]["scheme"] == "http"
    assert "--public-metrics" not in c["args"]
    assert service(gateway)["spec"]["ports"] == [{"name": "http", "port": ports["http"], "targetPort": "http"}]


def test_the_picker_config_reads_gauges_the_server_exports(gateway):
    config = picker_config(gateway)
    assert config["apiVersion"] == "inference.networking.x-k8s.io/v1alpha1"
    assert config["kind"] == "EndpointPickerConfig"
    mapping = engine_mapping(gateway, config)
    assert unexported_specs(mapping, server(gateway)["args"]) == []
    # Gantry's own names, with no vLLM aliases needed.
    assert metric_name(mapping["queuedRequestsSpec"]) == "gantry_requests_waiting"
    assert metric_name(mapping["kvUsageSpec"]) == "gantry_kv_cache_utilization"
    assert not any(a.startswith("--metrics-compat") for a in server(gateway)["args"])
    assert mapping["loraSpec"] == "", "Gantry exports no LoRA series"
    # The extractor runs on the scraped metrics.
    (source,) = config["dataLayer"]["sources"]
    assert plugins(config)[source["pluginRef"]]["type"] == "metrics-data-source"
    assert [plugins(config)[e["pluginRef"]]["type"] for e in source["extractors"]] == ["core-metrics-extractor"]


def test_the_metric_check_refuses_names_the_server_does_not_export(gateway):
    args = server(gateway)["args"]
    vllm = engine_mapping({("Deployment", "gantry"): {"spec": {"template": {"metadata": {"labels": {}}}}}},
                          {"plugins": [{"type": "core-metrics-extractor", "parameters": {"defaultEngine": "vllm"}}]})
    assert len(unexported_specs(vllm, args)) >= 4, "vLLM's names need --metrics-compat vllm"
    assert unexported_specs(vllm, args + ["--metrics-compat", "vllm"]) == []
    mapping = dict(engine_mapping(gateway, picker_config(gateway)), cacheNumBlocksLabelName="num_gpu_blocks")
    assert unexported_specs(mapping, args) == ["cacheNumBlocksLabelName: num_gpu_blocks on gantry_kv_cache_info"]


def test_the_picker_scores_queue_kv_cache_and_prefix_in_gantrys_blocks(gateway):
    config = picker_config(gateway)
    named = plugins(config)
    (profile,) = config["schedulingProfiles"]
    refs = [p["pluginRef"] for p in profile["plugins"]]
    assert set(refs) <= set(named), "every profile entry names a configured plugin"
    types = {named[r]["type"]: p.get("weight") for r, p in zip(refs, profile["plugins"])}
    assert {"queue-scorer", "kv-cache-utilization-scorer", "prefix-cache-scorer", "max-score-picker"} <= set(types)
    assert all(types[s] > 0 for s in ("queue-scorer", "kv-cache-utilization-scorer", "prefix-cache-scorer"))
    assert "single-profile-handler" in {p["type"] for p in config["plugins"]}
    (prefix,) = [p for p in config["plugins"] if p["type"] == "prefix-cache-scorer"]
    assert prefix["parameters"]["blockSizeTokens"] == kv_block_tokens()


def test_the_http_route_sends_the_gateways_requests_to_the_pool(gateway):
    route = doc(gateway, "HTTPRoute", "gantry")
    assert route["apiVersion"] == "gateway.networking.k8s.io/v1"
    (parent,) = route["spec"]["parentRefs"]
    assert parent == {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "inference-gateway"}
    (rule,) = route["spec"]["rules"]
    pool = doc(gateway, "InferencePool", "gantry")
    assert rule["backendRefs"] == [{"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": pool["metadata"]["name"]}]
    assert rule["matches"] == [{"path": {"type": "PathPrefix", "value": "/"}}]


def test_network_policy_admits_only_the_picker_and_prometheus_to_the_metrics_port(gateway):
    policy = doc(gateway, "NetworkPolicy", "gantry")["spec"]
    (rule,) = [r for r in policy["ingress"] if any(p["port"] == "metrics" for p in r["ports"])]
    assert rule["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    pods = [peer for peer in rule["from"] if "podSelector" in peer]
    namespaces = [peer for peer in rule["from"] if "namespaceSelector" in peer]
    assert len(pods) + len(namespaces) == len(rule["from"]) == 2
    assert all("namespaceSelector" not in peer for peer in pods), "the picker runs in this namespace"
    (picker_peer,) = pods
    picker_labels = picker(gateway)["spec"]["template"]["metadata"]["labels"]
    selector = picker_peer["podSelector"]["matchLabels"]
    assert selector and selector.items() <= picker_labels.items()
    assert not selector.items() <= pod_labels(gateway).items(), "the server pods do not admit each other"
    (prometheus,) = namespaces
    assert prometheus["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "monitoring"}
    assert "podSelector" not in prometheus


def test_the_pickers_service_account_may_watch_its_pool_and_pods(gateway):
    pod = picker(gateway)["spec"]["template"]["spec"]
    account = pod["serviceAccountName"]
    doc(gateway, "ServiceAccount", account)
    allowed = set()
    for binding in of_kind(gateway, "RoleBinding"):
        if {"kind": "ServiceAccount", "name": account} not in [{k: s[k] for k in ("kind", "name")} for s in binding["subjects"]]:
            continue
        assert binding["roleRef"]["kind"] == "Role" and binding["roleRef"]["apiGroup"] == "rbac.authorization.k8s.io"
        for rule in doc(gateway, "Role", binding["roleRef"]["name"])["rules"]:
            allowed |= {(g, r, v) for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    for group, resource in (("", "pods"), ("inference.networking.k8s.io", "inferencepools")):
        for verb in ("get", "list", "watch"):
            assert (group, resource, verb) in allowed, f"{verb} {resource}"
    assert not any(v in {"create", "update", "patch", "delete", "*"} for _, _, v in allowed), "the picker only reads"
    # The Gantry pods still get no token; the picker does need one.
    assert pod_spec(gateway)["automountServiceAccountToken"] is False
    assert pod.get("automountServiceAccountToken", True) is True


def test_the_docs_show_the_picker_config_as_it_is():
    """docs/replicas.md prints the picker's configuration in full; it must not drift from the file."""
    config = (GATEWAY / "endpoint-picker-config.yaml").read_text()
    body = config[config.index("apiVersion:") :].strip()
    docs = (ROOT / "docs" / "replicas.md").read_text()
    section = docs[docs.index("### Behind the Kubernetes inference gateway") :]
    block = re.search(r"```yaml\n(.*?)\n```", section, re.S).group(1).strip()
    assert block == body
    yaml.safe_load(block)
