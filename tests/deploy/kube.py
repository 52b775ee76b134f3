"""Helpers for the Kubernetes manifest tests: Kustomize's output by (kind, name), the Gantry
server's Deployment and container, and its args as Kubernetes expands them."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
KUBE = ROOT / "deploy" / "kubernetes"


def render(kustomization: Path) -> dict[tuple[str, str], dict]:
    """`kubectl kustomize`'s documents by (kind, name); an overlay may hold several of one kind."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: the Kustomize manifests were not rendered or checked")
    out = subprocess.run([kubectl, "kustomize", str(kustomization)], check=True, capture_output=True, text=True, timeout=60).stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    by_key = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    assert len(by_key) == len(docs), f"two documents of one kind and name: {sorted((d['kind'], d['metadata']['name']) for d in docs)}"
    return by_key


def of_kind(rendered, kind: str) -> list[dict]:
    return [d for (k, _), d in rendered.items() if k == kind]


def doc(rendered, kind: str, name: str) -> dict:
    assert (kind, name) in rendered, f"no {kind} {name}: {sorted(rendered)}"
    return rendered[(kind, name)]


def deployment(rendered) -> dict:
    """The Gantry server's Deployment (an overlay may add others, e.g. an endpoint picker)."""
    return doc(rendered, "Deployment", "gantry")


def service(rendered) -> dict:
    return doc(rendered, "Service", "gantry")


def pod_spec(rendered) -> dict:
    return deployment(rendered)["spec"]["template"]["spec"]


def pod_labels(rendered) -> dict:
    return deployment(rendered)["spec"]["template"]["metadata"]["labels"]


def server(rendered) -> dict:
    (c,) = [c for c in pod_spec(rendered)["containers"] if c["name"] == "gantry"]
    return c


def flag(args: list[str], name: str) -> str:
    """The value of `--name=V` or `--name V` in a container's args."""
    for i, a in enumerate(args):
        if a.startswith(f"--{name}="):
            return a.split("=", 1)[1]
        if a == f"--{name}":
            return args[i + 1]
    raise AssertionError(f"--{name} not in {args}")


def env_value(rendered, container: dict, name: str) -> str:
    """A container's env var, followed into the ConfigMap or Secret it references."""
    (var,) = [e for e in container.get("env", []) if e["name"] == name]
    if "value" in var:
        return var["value"]
    ref = var["valueFrom"]
    if "configMapKeyRef" in ref:
        cm = doc(rendered, "ConfigMap", ref["configMapKeyRef"]["name"])
        return cm["data"][ref["configMapKeyRef"]["key"]]
    raise AssertionError(f"{name} comes from a Secret, which the manifests do not hold")


def expand(rendered, container: dict, arg: str) -> str:
    """Kubernetes' $(VAR) expansion of a container's command and args."""
    return re.sub(r"\$\((\w+)\)", lambda m: env_value(rendered, container, m.group(1)), arg)
