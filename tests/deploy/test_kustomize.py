"""The kustomize subset of tests/deploy/kustomize.py, on small kustomizations written here: what each
feature does to the objects, and that anything else is refused rather than ignored."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.deploy.kustomize import KustomizeError, render

DEPLOYMENT = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "web"},
    "spec": {
        "replicas": 1,
        "template": {
            "spec": {
                "containers": [
                    {"name": "app", "image": "example/app", "env": [{"name": "A", "value": "1"}]},
                    {"name": "sidecar", "image": "example/sidecar:2"},
                ]
            }
        },
    },
}


def write(folder: Path, kustomization: dict, **files: object) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    for name, content in files.items():
        (folder / name).write_text(yaml.safe_dump_all(content if isinstance(content, list) else [content]))
    return folder


def test_an_overlay_patches_labels_retags_and_places_its_base(tmp_path):
    write(
        tmp_path / "base",
        {"resources": ["web.yaml"], "labels": [{"pairs": {"team": "ml"}}]},
        **{"web.yaml": DEPLOYMENT},
    )
    patch = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 3,
            "template": {"spec": {"containers": [{"name": "app", "env": [{"name": "B", "value": "2"}]}]}},
        },
    }
    overlay = write(
        tmp_path / "prod",
        {
            "resources": ["../base"],
            "namespace": "shop",
            "images": [{"name": "example/app", "newName": "registry/app", "newTag": "7"}],
            "patches": [{"path": "patch.yaml"}],
        },
        **{"patch.yaml": patch},
    )
    [web] = render(overlay)
    app, sidecar = web["spec"]["template"]["spec"]["containers"]
    assert web["metadata"] == {"name": "web", "namespace": "shop", "labels": {"team": "ml"}}
    assert web["spec"]["replicas"] == 3
    assert app["image"] == "registry/app:7" and sidecar["image"] == "example/sidecar:2"
    assert app["env"] == [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]
    assert "labels" not in web["spec"]["template"].get("metadata", {})  # labels reach metadata only


@pytest.mark.parametrize(
    ("kustomization", "problem"),
    [
        ({"resources": ["web.yaml"], "configMapGenerator": []}, "unsupported kustomization fields"),
        ({"resources": ["web.yaml"], "labels": [{"pairs": {"a": "b"}, "includeSelectors": True}]}, "labels"),
        ({"resources": ["web.yaml"], "images": [{"name": "example/app", "digest": "sha256:0"}]}, "image"),
        ({"resources": ["web.yaml"], "patches": [{"path": "web.yaml", "target": {"kind": "Deployment"}}]}, "patches"),
    ],
)
def test_features_outside_the_subset_are_refused(tmp_path, kustomization, problem):
    folder = write(tmp_path, kustomization, **{"web.yaml": DEPLOYMENT})
    with pytest.raises(KustomizeError, match=problem):
        render(folder)


def test_a_patch_directive_or_a_patch_of_nothing_is_refused(tmp_path):
    directive = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {"$patch": "delete"},
    }
    folder = write(
        tmp_path / "a",
        {"resources": ["web.yaml"], "patches": [{"path": "p.yaml"}]},
        **{"web.yaml": DEPLOYMENT, "p.yaml": directive},
    )
    with pytest.raises(KustomizeError, match="directives"):
        render(folder)
    missing = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "api"}, "spec": {"replicas": 2}}
    folder = write(
        tmp_path / "b",
        {"resources": ["web.yaml"], "patches": [{"path": "p.yaml"}]},
        **{"web.yaml": DEPLOYMENT, "p.yaml": missing},
    )
    with pytest.raises(KustomizeError, match="matches 0 objects"):
        render(folder)
