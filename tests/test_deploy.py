"""deploy/: the examples' rate-limit configs load, and the checks scripts/check-deploy runs on
the Istio and Envoy Gateway examples refuse what Envoy would refuse."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ratekeeper.service.config import load
from tests import deploy_check

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"


def test_the_compose_runtime_directory_loads() -> None:
    config = load([str(DEPLOY / "compose" / "runtime" / "ratelimit" / "config")])
    assert config.files and all("edge.yaml" in f for f in config.files)


def test_the_kubernetes_configmap_loads(tmp_path: Path) -> None:
    documents = list(yaml.safe_load_all((DEPLOY / "kubernetes" / "ratekeeper.yaml").read_text()))
    configmap = next(d for d in documents if d["kind"] == "ConfigMap")
    for name, text in configmap["data"].items():
        (tmp_path / name).write_text(text)
    assert load([str(tmp_path)]).files


@pytest.mark.parametrize("name", ["istio.yaml", "envoy-gateway.yaml"])
def test_the_mesh_examples_parse_as_envoys_protos(name: str) -> None:
    assert deploy_check.check_file(str(DEPLOY / "kubernetes" / name)) >= 1


def test_a_field_envoy_does_not_know_is_refused(tmp_path: Path) -> None:
    text = (DEPLOY / "kubernetes" / "istio.yaml").read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("failure_mode_deny: false", "failure_mode_denied: false"))
    with pytest.raises(ValueError, match="failure_mode_denied"):
        deploy_check.check_file(str(bad))


def test_a_document_without_a_name_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {}\n")
    with pytest.raises(ValueError, match=r"metadata\.name"):
        deploy_check.check_file(str(bad))
