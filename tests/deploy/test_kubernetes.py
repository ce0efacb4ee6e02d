"""deploy/kubernetes/ as kustomize renders it: valid against the Kubernetes schemas, and in step
with the images (user, port, start period), the settings (strict names, drain time) and keys."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from decidealot import config, metrics, registry

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES = ROOT / "deploy" / "kubernetes"
KUSTOMIZATIONS = ("base", "overlays/scaled", "overlays/queue-scaled", "overlays/cuda")

needs_kubectl = pytest.mark.skipif(
    shutil.which("kubectl") is None, reason="kubectl renders the kustomizations"
)


def _render(kustomization: str) -> dict[str, dict[str, Any]]:
    """The rendered resources by kind (one of each kind here)."""
    rendered = subprocess.run(
        ["kubectl", "kustomize", str(KUBERNETES / kustomization)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    return {doc["kind"]: doc for doc in yaml.safe_load_all(rendered)}


def _pod(resources: dict[str, dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The Deployment's pod spec and its one container."""
    pod = resources["Deployment"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    return pod, container


@needs_kubectl
def test_the_renderings_validate_against_the_kubernetes_schemas() -> None:
    # kubernetes-validate lies beside this interpreter (the test extra), on PATH or not.
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    result = subprocess.run(
        [str(KUBERNETES / "validate")],
        env=os.environ | {"PATH": path},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert f"{len(KUSTOMIZATIONS)} renderings valid" in result.stdout


@needs_kubectl
@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_the_pod_runs_like_the_image(kustomization: str) -> None:
    resources = _render(kustomization)
    pod, container = _pod(resources)
    dockerfile = (ROOT / "Dockerfile").read_text()
    user = re.search(r"^USER (\d+):(\d+)$", dockerfile, re.M)
    assert user is not None
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == int(user[1])
    assert pod["securityContext"]["fsGroup"] == int(user[2])
    assert container["securityContext"]["allowPrivilegeEscalation"] is False

    (port,) = container["ports"]
    assert f"DECIDEALOT_PORT={port['containerPort']}" in dockerfile
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": port["name"]}
    startup = container["startupProbe"]
    start_period = re.search(r"--start-period=(\d+)m", dockerfile)
    assert start_period is not None
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 60 * int(start_period[1])
    assert {"cpu", "memory"} <= container["resources"]["requests"].keys()


@needs_kubectl
@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_sigterm_drains_before_the_grace_period_ends(kustomization: str) -> None:
    resources = _render(kustomization)
    pod, container = _pod(resources)
    settings = registry.from_env(resources["ConfigMap"]["data"])
    sleep = container["lifecycle"]["preStop"]["exec"]["command"]
    assert sleep[0] == "sleep"
    unwind = 5  # decidealot/service.py: what the drain cancels gets 5 s to answer 503
    worker_exit = 5  # docs/operations.md, Shutdown: workers still running after 5 s are killed
    drain = int(sleep[1]) + settings.drain_seconds + unwind + worker_exit
    assert pod["terminationGracePeriodSeconds"] > drain
    liveness = container["livenessProbe"]
    # A drain answers /health with 503: liveness must not restart the pod before it ends.
    assert liveness["periodSeconds"] * liveness["failureThreshold"] > drain


@needs_kubectl
@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_settings_are_known_names_and_keys_are_files_of_the_secret(
    kustomization: str, tmp_path: Path
) -> None:
    resources = _render(kustomization)
    pod, container = _pod(resources)
    settings = resources["ConfigMap"]["data"]
    assert pod["enableServiceLinks"] is False  # no DECIDEALOT_PORT=tcp://... from the Service
    assert not [name for name in settings if "_API_KEY" in name]
    (volume,) = [v for v in pod["volumes"] if "secret" in v]
    assert volume["secret"]["secretName"] == "decidealot-keys"
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
    assert mount["readOnly"] is True
    # no key in the environment: each is a file of the Secret, named after its key there
    env = {v["name"]: v["value"] for v in container["env"]}
    assert env["DECIDEALOT_API_KEY_FILE"] == f"{mount['mountPath']}/DECIDEALOT_API_KEY"
    assert env["HF_TOKEN_PATH"] == f"{mount['mountPath']}/HF_TOKEN"
    for name, value in env.items():
        assert name.startswith(config.PREFIX) or name == "HF_TOKEN_PATH"  # from_env checks it
        assert not name.endswith("_KEY") and name != "HF_TOKEN"
        assert value.startswith(mount["mountPath"] + "/")
    # the strict parse the pod's `serve` does, its key files where the pod would find them
    files = {name: tmp_path / Path(value).name for name, value in env.items()}
    for path in files.values():
        path.write_text("a-key\n")
    registry.from_env(settings | {name: str(path) for name, path in files.items()})

    model_dir = settings["DECIDEALOT_MODEL_DIR"]
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == model_dir]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    claim = volume["persistentVolumeClaim"]["claimName"]
    assert resources["PersistentVolumeClaim"]["metadata"]["name"] == claim


@needs_kubectl
def test_the_cuda_overlay_asks_for_a_gpu_and_the_cuda_image() -> None:
    _, container = _pod(_render("overlays/cuda"))
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert container["image"].endswith("-cuda")
    assert "nvidia.com/gpu" not in _pod(_render("base"))[1]["resources"]["limits"]


@needs_kubectl
def test_the_scaled_overlay_shares_the_models_and_bounds_disruption() -> None:
    resources = _render("overlays/scaled")
    assert resources["PersistentVolumeClaim"]["spec"]["accessModes"] == ["ReadWriteMany"]
    assert resources["HorizontalPodAutoscaler"]["spec"]["minReplicas"] >= 2
    pods = resources["Deployment"]["spec"]["template"]["metadata"]["labels"]
    selector = resources["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pods.items()
    assert resources["Deployment"]["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


@needs_kubectl
def test_the_queue_scaled_overlay_scales_on_a_metric_the_pods_serve() -> None:
    """The HPA's pods metric is one the service exports, prometheus-adapter's rule (the chart
    values shipped beside it) serves it under that name per pod, and Prometheus is told where
    each pod's /metrics is."""
    resources = _render("overlays/queue-scaled")
    hpa = resources["HorizontalPodAutoscaler"]["spec"]
    (pods,) = [m["pods"] for m in hpa["metrics"] if m["type"] == "Pods"]
    name = pods["metric"]["name"]
    assert name == metrics.PENDING_REQUESTS.describe()[0].name
    assert pods["target"]["type"] == "AverageValue"
    assert "cpu" in {m["resource"]["name"] for m in hpa["metrics"] if m["type"] == "Resource"}
    assert hpa["minReplicas"] >= 2  # components/scaling's, kept

    adapter = KUBERNETES / "components" / "queue-scaling" / "prometheus-adapter.yaml"
    rules = yaml.safe_load(adapter.read_text())
    (rule,) = rules["rules"]["custom"]
    assert rule["seriesQuery"].startswith(name + "{")
    assert rule["name"]["as"] == name
    assert rule["resources"]["overrides"]["pod"] == {"resource": "pod"}

    annotations = resources["Deployment"]["spec"]["template"]["metadata"]["annotations"]
    _, container = _pod(resources)
    (port,) = container["ports"]
    assert annotations["prometheus.io/port"] == str(port["containerPort"])
    assert annotations["prometheus.io/path"] == "/metrics"
