"""Renders a kustomization as `kubectl kustomize` does, for exactly the features deploy/k8s uses:
`resources` (files and folders holding a kustomization.yaml), `namespace`, `labels` (metadata labels only),
`images` and `patches` (strategic-merge patch files). Any other field is refused, so a manifest that
starts to use one fails its test instead of rendering silently wrong. No kustomize binary or cluster is
needed; tests/deploy/test_kustomize.py checks this renderer's rules."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

FIELDS = {"apiVersion", "kind", "resources", "namespace", "labels", "images", "patches"}


class KustomizeError(ValueError):
    pass


def render(folder: Path) -> list[dict]:
    """The objects the kustomization in `folder` builds."""
    spec = yaml.safe_load((folder / "kustomization.yaml").read_text())
    unsupported = set(spec) - FIELDS
    if unsupported:
        raise KustomizeError(f"{folder}: unsupported kustomization fields {sorted(unsupported)}")
    objects = [obj for entry in spec.get("resources", []) for obj in load_resource(folder / entry)]
    for patch_entry in spec.get("patches", []):
        if set(patch_entry) != {"path"}:
            raise KustomizeError(f"{folder}: only `patches: - path: FILE` is supported, not {patch_entry}")
        for patch in yaml.safe_load_all((folder / patch_entry["path"]).read_text()):
            apply_patch(objects, patch)
    for label_entry in spec.get("labels", []):
        add_labels(objects, label_entry)
    for image in spec.get("images", []):
        set_image(objects, image)
    if "namespace" in spec:
        for obj in objects:
            obj["metadata"]["namespace"] = spec["namespace"]
    return objects


def load_resource(path: Path) -> list[dict]:
    if path.is_dir():
        return render(path)
    return [obj for obj in yaml.safe_load_all(path.read_text()) if obj]


def key(obj: dict) -> tuple[str, str]:
    return obj["kind"], obj["metadata"]["name"]


def apply_patch(objects: list[dict], patch: dict) -> None:
    targets = [obj for obj in objects if key(obj) == key(patch)]
    if len(targets) != 1:
        raise KustomizeError(f"patch {key(patch)} matches {len(targets)} objects")
    merged = merge(targets[0], patch)
    targets[0].clear()
    targets[0].update(merged)


def merge(base, patch):
    """Strategic merge as kustomize applies it to these objects: maps merge key by key, lists of named
    maps (containers, env, volumes, ports) merge by name, other lists and values are replaced."""
    if isinstance(base, dict) and isinstance(patch, dict):
        if any(str(k).startswith("$") for k in patch):
            raise KustomizeError(f"patch directives are not supported: {sorted(patch)}")
        merged = copy.deepcopy(base)
        for name, value in patch.items():
            merged[name] = merge(base[name], value) if name in base else copy.deepcopy(value)
        return merged
    if isinstance(base, list) and isinstance(patch, list) and all(named(item) for item in base + patch):
        merged = [copy.deepcopy(item) for item in base]
        for item in patch:
            index = next((i for i, old in enumerate(merged) if old["name"] == item["name"]), None)
            if index is None:
                merged.append(copy.deepcopy(item))
            else:
                merged[index] = merge(merged[index], item)
        return merged
    return copy.deepcopy(patch)


def named(item) -> bool:
    return isinstance(item, dict) and "name" in item


def add_labels(objects: list[dict], entry: dict) -> None:
    if (
        set(entry) - {"pairs", "includeSelectors", "includeTemplates"}
        or entry.get("includeSelectors")
        or (entry.get("includeTemplates"))
    ):
        raise KustomizeError(f"only `labels: - pairs:` on objects' metadata is supported, not {entry}")
    for obj in objects:
        obj["metadata"].setdefault("labels", {}).update(entry["pairs"])


def set_image(objects: list[dict], image: dict) -> None:
    if set(image) - {"name", "newName", "newTag"}:
        raise KustomizeError(f"only name, newName and newTag of an image are supported, not {image}")
    for container in containers(objects):
        name, _, tag = container["image"].partition(":")
        if name == image["name"]:
            new_tag = image.get("newTag", tag)
            container["image"] = image.get("newName", name) + (f":{new_tag}" if new_tag else "")


def containers(objects: list[dict]) -> list[dict]:
    pods = [obj["spec"]["template"]["spec"] for obj in objects if obj["kind"] == "Deployment"]
    return [c for pod in pods for c in pod.get("initContainers", []) + pod["containers"]]
