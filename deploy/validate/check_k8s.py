#!/usr/bin/env python3
"""Schema and consistency check of Kubernetes manifests, offline.

The schema is the one of the official Kubernetes Python client (its models
are generated from the Kubernetes OpenAPI spec): every object's kind and
apiVersion must be known, every field must exist in its model (no typo passes
silently), every value must have the model's type (string, integer, boolean,
list, map, nested object), and every required field must be present.

Then what a schema cannot see, across the files:
  * a workload's selector matches its pod template's labels;
  * a Service selects the pods of some workload, and its named targetPorts
    exist on those pods' containers;
  * every volumeMount names a volume (or a volumeClaimTemplate), every
    ConfigMap / Secret a pod uses is defined, and every probe's named port
    exists;
  * a StatefulSet's serviceName is a headless Service that selects it.

Usage: check_k8s.py FILE.yaml...   (exit 0: clean; 1: problems, listed)
"""

import re
import sys

import yaml
from kubernetes import client
from kubernetes.client.configuration import Configuration

KINDS = {
    ("v1", "Namespace"): "V1Namespace",
    ("v1", "ConfigMap"): "V1ConfigMap",
    ("v1", "Secret"): "V1Secret",
    ("v1", "Service"): "V1Service",
    ("v1", "PersistentVolumeClaim"): "V1PersistentVolumeClaim",
    ("apps/v1", "Deployment"): "V1Deployment",
    ("apps/v1", "StatefulSet"): "V1StatefulSet",
    ("apps/v1", "DaemonSet"): "V1DaemonSet",
    ("policy/v1", "PodDisruptionBudget"): "V1PodDisruptionBudget",
}

_required_cache = {}


def required_fields(cls):
    """Python attribute names whose setter refuses None (the model's required fields)."""
    if cls not in _required_cache and hasattr(cls, "model_fields"):
        # Newer clients: pydantic models.
        _required_cache[cls] = [name for name, f in cls.model_fields.items() if f.is_required()]
    if cls not in _required_cache:
        inst = cls.__new__(cls)
        inst.local_vars_configuration = Configuration()
        inst.local_vars_configuration.client_side_validation = True
        req = []
        for attr in cls.openapi_types:
            try:
                setattr(inst, attr, None)
            except ValueError:
                req.append(attr)
        _required_cache[cls] = req
    return _required_cache[cls]


def check_value(value, typ, path, errors):
    if value is None:
        return
    if typ in ("str", "datetime", "date", "bytes"):
        if not isinstance(value, str):
            errors.append(f"{path}: expected a string, got {type(value).__name__} {value!r}")
    elif typ == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            errors.append(f"{path}: expected an integer, got {value!r}")
    elif typ == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            errors.append(f"{path}: expected a number, got {value!r}")
    elif typ == "bool":
        if not isinstance(value, bool):
            errors.append(f"{path}: expected a boolean, got {value!r}")
    elif typ == "object":
        pass  # int-or-string and free-form fields
    elif typ.startswith("list[") or typ.startswith("List["):
        inner = typ[5:-1]
        if not isinstance(value, list):
            errors.append(f"{path}: expected a list, got {type(value).__name__}")
            return
        for i, v in enumerate(value):
            check_value(v, inner, f"{path}[{i}]", errors)
    elif typ.startswith("dict(") or typ.startswith("Dict["):
        inner = re.match(r"(?:dict\(str, (.*)\)|Dict\[str, (.*)\])$", typ)
        inner = inner.group(1) or inner.group(2)
        if not isinstance(value, dict):
            errors.append(f"{path}: expected a map, got {type(value).__name__}")
            return
        for k, v in value.items():
            if not isinstance(k, str):
                errors.append(f"{path}: key {k!r} is not a string")
            check_value(v, inner, f"{path}.{k}", errors)
    else:
        cls = getattr(client, typ, None)
        if cls is None:
            errors.append(f"{path}: unknown model type {typ}")
            return
        check_model(value, cls, path, errors)


def check_model(obj, cls, path, errors):
    if not isinstance(obj, dict):
        errors.append(f"{path}: expected an object ({cls.__name__}), got {type(obj).__name__}")
        return
    by_json = {json: py for py, json in cls.attribute_map.items()}
    for key, value in obj.items():
        py = by_json.get(key)
        if py is None:
            errors.append(f"{path}: unknown field {key!r} in {cls.__name__}")
            continue
        check_value(value, cls.openapi_types[py], f"{path}.{key}", errors)
    for py in required_fields(cls):
        if cls.attribute_map[py] not in obj:
            errors.append(f"{path}: required field {cls.attribute_map[py]!r} of {cls.__name__} is missing")


def pod_spec_of(doc):
    kind = doc.get("kind")
    if kind in ("Deployment", "StatefulSet", "DaemonSet"):
        return doc.get("spec", {}).get("template", {})
    return None


def cross_checks(docs, errors):
    names = {(d.get("kind"), d.get("metadata", {}).get("namespace"), d.get("metadata", {}).get("name")) for _, d in docs}
    workloads = [(f, d) for f, d in docs if pod_spec_of(d) is not None]
    for f, d in workloads:
        name = f"{f}: {d['kind']} {d['metadata']['name']}"
        ns = d["metadata"].get("namespace")
        template = pod_spec_of(d)
        labels = template.get("metadata", {}).get("labels", {})
        selector = d["spec"].get("selector", {}).get("matchLabels", {})
        if not selector or any(labels.get(k) != v for k, v in selector.items()):
            errors.append(f"{name}: selector {selector} does not match the pod labels {labels}")
        spec = template.get("spec", {})
        volumes = {v["name"] for v in spec.get("volumes", [])}
        volumes |= {t["metadata"]["name"] for t in d["spec"].get("volumeClaimTemplates", [])}
        for v in spec.get("volumes", []):
            if "configMap" in v and ("ConfigMap", ns, v["configMap"]["name"]) not in names:
                errors.append(f"{name}: volume {v['name']} uses ConfigMap {v['configMap']['name']}, not defined")
            if "secret" in v and ("Secret", ns, v["secret"]["secretName"]) not in names:
                errors.append(f"{name}: volume {v['name']} uses Secret {v['secret']['secretName']}, not defined")
        for c in spec.get("containers", []):
            ports = {p.get("name") for p in c.get("ports", []) if p.get("name")}
            for m in c.get("volumeMounts", []):
                if m["name"] not in volumes:
                    errors.append(f"{name}: container {c['name']} mounts {m['name']!r}, which is no volume")
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                p = c.get(probe)
                if not p:
                    continue
                port = (p.get("tcpSocket") or p.get("httpGet") or {}).get("port")
                if isinstance(port, str) and port not in ports:
                    errors.append(f"{name}: {probe} of {c['name']} names port {port!r}, which the container does not declare")
        if d["kind"] == "StatefulSet":
            svc = [s for _, s in docs if s.get("kind") == "Service" and s["metadata"]["name"] == d["spec"].get("serviceName")]
            if not svc:
                errors.append(f"{name}: serviceName {d['spec'].get('serviceName')!r} is no Service")
            elif svc[0]["spec"].get("clusterIP") != "None":
                errors.append(f"{name}: its governing Service {svc[0]['metadata']['name']} is not headless")
    for f, s in docs:
        if s.get("kind") != "Service":
            continue
        name = f"{f}: Service {s['metadata']['name']}"
        sel = s["spec"].get("selector", {})
        matching = [
            d for _, d in workloads
            if d["metadata"].get("namespace") == s["metadata"].get("namespace")
            and all(pod_spec_of(d).get("metadata", {}).get("labels", {}).get(k) == v for k, v in sel.items())
        ]
        if not sel or not matching:
            errors.append(f"{name}: selector {sel} selects no workload's pods")
            continue
        pod_ports = {p.get("name") for d in matching for c in pod_spec_of(d)["spec"]["containers"] for p in c.get("ports", [])}
        for p in s["spec"].get("ports", []):
            tp = p.get("targetPort")
            if isinstance(tp, str) and tp not in pod_ports:
                errors.append(f"{name}: targetPort {tp!r} is no named port of the selected pods")


def main(paths):
    errors = []
    docs = []
    for path in paths:
        with open(path) as fh:
            try:
                loaded = list(yaml.safe_load_all(fh))
            except yaml.YAMLError as e:
                errors.append(f"{path}: not YAML: {e}")
                continue
        for i, doc in enumerate(loaded):
            if doc is None:
                continue
            where = f"{path}#{i}"
            key = (doc.get("apiVersion"), doc.get("kind"))
            model = KINDS.get(key)
            if model is None:
                errors.append(f"{where}: unsupported apiVersion/kind {key}")
                continue
            if not doc.get("metadata", {}).get("name"):
                errors.append(f"{where}: metadata.name missing")
            check_model(doc, getattr(client, model), f"{where} {doc['kind']}", errors)
            docs.append((path, doc))
    cross_checks(docs, errors)
    for e in errors:
        print(f"k8s: {e}")
    print(f"k8s: {len(docs)} objects in {len(paths)} files, {len(errors)} problems")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
