"""The part of kustomize infra/k8s uses, in Python: resources, namespace, labels, images, strategic-merge patches.

CI has no kubectl: the tests render the overlays with this, and compare it with `kubectl kustomize` where
kubectl is installed (tests/unit/infra/test_k8s_manifests.py), so the two cannot drift apart unnoticed.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

Object = dict[str, Any]
# The list fields infra/k8s patches, by the key Kubernetes merges their items on (patchMergeKey).
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
}
KNOWN_FIELDS = {"apiVersion", "kind", "resources", "namespace", "labels", "images", "patches"}


def render(directory: Path) -> list[Object]:
    """The objects `kubectl kustomize directory` prints (for the features above; anything else raises)."""
    spec = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(spec) - KNOWN_FIELDS
    if unknown:
        raise ValueError(f"{directory}: kustomization fields this renderer does not know: {sorted(unknown)}")
    objects: list[Object] = []
    for entry in spec.get("resources", []):
        path = directory / entry
        objects += render(path) if path.is_dir() else load(path)
    for patch in spec.get("patches", []):
        if set(patch) != {"path"}:
            raise ValueError(f"{directory}: only patches by path (the target named in the patch) are supported")
        for document in load(directory / patch["path"]):
            target = find(objects, document["kind"], document["metadata"]["name"])
            merged = merge(target, document)
            target.clear()
            target.update(merged)
    for entry in spec.get("labels", []):
        if set(entry) != {"pairs"}:
            raise ValueError(f"{directory}: labels support only `pairs` (metadata labels)")
        for item in objects:
            item["metadata"].setdefault("labels", {}).update(entry["pairs"])
    for image in spec.get("images", []):
        for container in containers(objects):
            name, _, tag = container["image"].partition(":")
            if name == image["name"]:
                container["image"] = f"{image.get('newName', name)}:{image.get('newTag', tag)}"
    if "namespace" in spec:
        for item in objects:
            if item["kind"] != "Namespace":
                item["metadata"]["namespace"] = spec["namespace"]
    return objects


def containers(objects: list[Object]) -> list[Object]:
    """Every container and init container of the workloads."""
    found = []
    for item in objects:
        if item["kind"] in {"Deployment", "StatefulSet", "Job"}:
            spec = item["spec"]["template"]["spec"]
            found += spec.get("initContainers", []) + spec["containers"]
    return found


def load(path: Path) -> list[Object]:
    """Every document of a YAML file."""
    return [document for document in yaml.safe_load_all(path.read_text()) if document]


def find(objects: list[Object], kind: str, name: str) -> Object:
    """The one object of this kind and name."""
    found = [item for item in objects if item["kind"] == kind and item["metadata"]["name"] == name]
    if len(found) != 1:
        raise ValueError(f"patch target {kind}/{name}: {len(found)} objects match")
    return found[0]


def merge(base: Any, patch: Any, field: str = "") -> Any:
    """A strategic merge: maps merge key by key, keyed lists item by item, any other value is replaced."""
    if isinstance(base, dict) and isinstance(patch, dict):
        mapping = copy.deepcopy(base)
        for name, value in patch.items():
            mapping[name] = merge(base[name], value, name) if name in base else copy.deepcopy(value)
        return mapping
    key = MERGE_KEYS.get(field)
    if key and isinstance(base, list) and isinstance(patch, list):
        # As kustomize orders them: the patch's items first (merged into the base's), then the base's others.
        old = {item.get(key): item for item in base}
        named = {item.get(key) for item in patch}
        merged = [merge(old[item.get(key)], item) if item.get(key) in old else copy.deepcopy(item) for item in patch]
        return merged + [copy.deepcopy(item) for item in base if item.get(key) not in named]
    return copy.deepcopy(patch)
