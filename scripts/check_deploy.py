"""Checks deploy/ against Kubernetes and against the binaries (scripts/check-deploy.sh runs it).

For every kustomization under deploy/k8s (base, overlays/*, examples/*):
  1. it renders with `kubectl kustomize`;
  2. every built-in object validates, strictly (unknown fields are errors), against the
     Kubernetes OpenAPI schemas of the versions in K8S_VERSIONS (kubernetes-validate); every
     ServingPool against the CRD in deploy/k8s/crd/servingpool.yaml; the few third-party kinds
     with no schema available offline are named as such, and any other kind is an error;
  3. the manifests agree with the binaries: each `sluice serve` container's args and
     environment pass `sluice serve --check-config` (the real parser and validation), its
     probes and ports are the port and paths that configuration serves, its grace period
     outlasts preStop plus --drain-timeout, a replica's startupProbe leaves time for a model
     load and its --model-dir is a mounted volume; a container of the CUDA image or one that
     requests nvidia.com/gpu runs its model on `--device cuda:N` and requests exactly one GPU
     (one replica per GPU; tensor parallelism is out of scope), and the CPU image is never
     given a GPU device; a gateway's k8s:// discovery target is a
     headless Service of the same render, in the gateway's namespace, with that port, selecting
     every replica pod and no gateway pod, and the gateway's ServiceAccount may watch its
     EndpointSlices; Services' target ports exist on the pods they select; a PDB selects pods;
     `sluice-autoscaler` containers use a subcommand and flags its --help lists; a ServingPool
     names Deployments and a Service of the same render.
Then the dashboard's and alert rules' metric names must exist in the code.

`--self-test` breaks rendered manifests on purpose, one way at a time, and fails unless each
break is reported: the checks above can fail.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "deploy" / "k8s"
CRD = K8S / "crd" / "servingpool.yaml"
OBS = ROOT / "deploy" / "observability"
# The oldest and the newest Kubernetes minor this project supports; the manifests must be valid
# on both (kubernetes-validate ships the schemas).
K8S_VERSIONS = ("1.33.0", "1.37.0")
# Kinds from CRDs whose schemas are not available offline: checked by the consistency rules
# only. Anything not built in, not here and not the ServingPool is an error.
THIRD_PARTY = {
    ("monitoring.googleapis.com/v1", "PodMonitoring"),
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("cloud.google.com/v1", "ComputeClass"),
}
# Series that come from outside sluice: kube-state-metrics and GKE log-based metrics.
EXTERNAL_METRICS = re.compile(r"^(kube_|logging_googleapis_com:user_)")
SERVE_IMAGES = ("sluice", "sluice-cuda")
# The headless Service annotation naming the served models (gateway/src/discovery/k8s.rs).
MODELS_ANNOTATION = "sluice.dev/models"


class Report:
    def __init__(self) -> None:
        self.errors: list[str] = []
        self.notes: list[str] = []

    def error(self, where: str, msg: str) -> None:
        self.errors.append(f"{where}: {msg}")

    def note(self, msg: str) -> None:
        if msg not in self.notes:
            self.notes.append(msg)


def kustomizations() -> list[Path]:
    dirs = [K8S / "base"]
    for parent in ("overlays", "examples"):
        dirs += sorted(p.parent for p in (K8S / parent).glob("*/kustomization.yaml"))
    return dirs


def render(kubectl: str, d: Path) -> list[dict]:
    out = subprocess.run([kubectl, "kustomize", str(d)], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"kubectl kustomize {d.relative_to(ROOT)} failed:\n{out.stderr}")
    return [o for o in yaml.safe_load_all(out.stdout) if o]


def name_of(o: dict) -> str:
    return f"{o.get('kind')}/{o.get('metadata', {}).get('name')}"


# ---------------------------------------------------------------------------------------------
# Schemas


def validate_schemas(objs: list[dict], where: str, rep: Report, crd: dict | None) -> None:
    import kubernetes_validate as kv

    for o in objs:
        api, kind = o.get("apiVersion"), o.get("kind")
        if kind == "ServingPool":
            if crd is None:
                rep.note(
                    f"SKIPPED: ServingPool not validated: {CRD.relative_to(ROOT)} is absent "
                    "(it comes with the autoscaler controller)"
                )
            else:
                for e in crd_errors(o, crd):
                    rep.error(f"{where} {name_of(o)}", e)
            continue
        if (api, kind) in THIRD_PARTY:
            rep.note(f"not schema-validated (its CRD's schema is not available offline): {api} {kind}")
            continue
        for version in K8S_VERSIONS:
            try:
                kv.validate(o, version, strict=True)
            except kv.SchemaNotFoundError:
                rep.error(f"{where} {name_of(o)}", f"no schema for {api} {kind} in Kubernetes {version}")
                break
            except kv.ValidationError as e:
                path = "/".join(str(p) for p in e.path)
                rep.error(f"{where} {name_of(o)}", f"Kubernetes {version}: {path}: {e.message}")
                break


def load_crd() -> dict | None:
    if not CRD.exists():
        return None
    docs = [d for d in yaml.safe_load_all(CRD.read_text()) if d]
    crds = [d for d in docs if d.get("kind") == "CustomResourceDefinition"]
    if len(crds) != 1:
        raise RuntimeError(f"{CRD}: expected one CustomResourceDefinition, found {len(crds)}")
    return crds[0]


def crd_errors(obj: dict, crd: dict) -> list[str]:
    """The object against its CRD: group, kind, served version, and the version's
    openAPIV3Schema (JSON Schema, with unknown fields refused as the API server's strict
    field validation does)."""
    import jsonschema

    spec = crd["spec"]
    group, version = obj["apiVersion"].split("/", 1)
    if group != spec["group"] or obj["kind"] != spec["names"]["kind"]:
        return [f"{obj['apiVersion']} {obj['kind']} is not the CRD's {spec['group']} {spec['names']['kind']}"]
    versions = {v["name"]: v for v in spec["versions"]}
    if version not in versions or not versions[version].get("served", False):
        return [f"version {version} is not served by the CRD (served: {sorted(versions)})"]
    schema = copy.deepcopy(versions[version]["schema"]["openAPIV3Schema"])
    strictify(schema)
    body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
    props = schema.get("properties", {})
    for k in ("apiVersion", "kind", "metadata"):
        props.pop(k, None)
    schema.get("required", []) and schema.update(
        required=[r for r in schema["required"] if r not in ("apiVersion", "kind", "metadata")]
    )
    v = jsonschema.Draft7Validator(schema)
    return [f"{'/'.join(map(str, e.path)) or '(root)'}: {e.message}" for e in v.iter_errors(body)]


def strictify(s: dict) -> None:
    """OpenAPI structural schema → JSON Schema that refuses unknown fields (`nullable` too)."""
    if not isinstance(s, dict):
        return
    if s.get("nullable") and "type" in s:
        s["type"] = [s["type"], "null"]
    if "properties" in s and "additionalProperties" not in s and not s.get(
        "x-kubernetes-preserve-unknown-fields"
    ):
        s["additionalProperties"] = False
    for key in ("properties", "patternProperties"):
        for sub in s.get(key, {}).values():
            strictify(sub)
    for key in ("items", "additionalProperties", "not"):
        if isinstance(s.get(key), dict):
            strictify(s[key])
    for key in ("allOf", "anyOf", "oneOf"):
        for sub in s.get(key, []):
            strictify(sub)


# ---------------------------------------------------------------------------------------------
# Consistency with the binaries


def pod_spec(o: dict) -> dict | None:
    if o.get("kind") in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
        return o["spec"]["template"]["spec"]
    return None


def pod_labels(o: dict) -> dict:
    return o["spec"]["template"].get("metadata", {}).get("labels", {}) or {}


def selects(selector: dict | None, labels: dict) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def image_name(image: str) -> str:
    return image.rsplit("/", 1)[-1].split("@")[0].split(":")[0]


def container_env(o: dict, c: dict) -> tuple[dict, list[str]]:
    """The container's environment as the kubelet builds it: literal values, the downward API
    fields this checker can know (namespace, pod name), and the names it cannot."""
    env, unknown = {}, []
    ns = o["metadata"].get("namespace", "default")
    for e in c.get("env", []) or []:
        if "value" in e:
            env[e["name"]] = expand(e["value"], env)
        elif "valueFrom" in e:
            ref = e["valueFrom"].get("fieldRef", {}).get("fieldPath")
            if ref == "metadata.namespace":
                env[e["name"]] = ns
            elif ref == "metadata.name":
                env[e["name"]] = f"{o['metadata']['name']}-0"
            else:
                unknown.append(e["name"])
    return env, unknown


def expand(s: str, env: dict) -> str:
    """Kubernetes' $(VAR) expansion in args and env values ($$ escapes)."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), s)


def port_number(c: dict, port) -> int | None:
    if isinstance(port, int):
        return port
    for p in c.get("ports", []) or []:
        if p.get("name") == port:
            return p["containerPort"]
    return None


def check_config(sluice: str, args: list[str], env: dict) -> tuple[dict | None, str]:
    clean = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    clean.update({k: v for k, v in env.items() if k.startswith("SLUICE_")})
    out = subprocess.run([sluice, *args, "--check-config"], capture_output=True, text=True, env=clean)
    if out.returncode != 0:
        return None, (out.stderr.strip() or f"exit {out.returncode}")
    return json.loads(out.stdout), ""


def check_consistency(objs: list[dict], where: str, rep: Report, bins: dict) -> None:
    services = {(o["metadata"].get("namespace"), o["metadata"]["name"]): o
                for o in objs if o.get("kind") == "Service"}
    workloads = [o for o in objs if pod_spec(o) is not None]
    serve = {}  # (workload name, container name) -> check-config summary
    for o in workloads:
        spec = pod_spec(o)
        for c in spec.get("containers", []):
            at = f"{where} {name_of(o)} container {c['name']}"
            env, unknown = container_env(o, c)
            args = [expand(a, env) for a in c.get("args", []) or []]
            cmd = c.get("command")
            if cmd is None and image_name(c["image"]) in SERVE_IMAGES and args[:1] == ["serve"]:
                for a in args:
                    if "$(" in a:
                        rep.error(at, f"argument {a!r} refers to a variable the container does not define")
                cfg, err = check_config(bins["sluice"], args, env)
                if cfg is None:
                    rep.error(at, f"`sluice {' '.join(args)} --check-config` refused it: {err}")
                    continue
                if unknown and any(u.startswith("SLUICE_") for u in unknown):
                    rep.error(at, f"SLUICE_* variables from sources this check cannot read: {unknown}")
                serve[(o["metadata"]["name"], c["name"])] = cfg
                check_serve_container(o, c, cfg, at, rep)
                check_device(c, cfg, at, rep)
            elif cmd and os.path.basename(cmd[0]) == "sluice-autoscaler":
                check_autoscaler_args(bins["sluice-autoscaler"], cmd[1:] + args, at, rep)
            elif cmd is None and image_name(c["image"]) in SERVE_IMAGES:
                rep.error(at, f"runs the image's entrypoint with args {args}, not `serve`")

    replicas = [o for o in workloads
                if any(serve.get((o["metadata"]["name"], c["name"]), {}).get("model")
                       for c in pod_spec(o)["containers"])]
    gateways = [o for o in workloads
                if any(serve.get((o["metadata"]["name"], c["name"]), {}).get("routing")
                       and not serve[(o["metadata"]["name"], c["name"])].get("model")
                       for c in pod_spec(o)["containers"])]
    for g in gateways:
        for c in pod_spec(g)["containers"]:
            cfg = serve.get((g["metadata"]["name"], c["name"]))
            if cfg:
                check_discovery(g, cfg, services, replicas, gateways, objs, f"{where} {name_of(g)}", rep)
                check_models_annotation(cfg, services, replicas, serve, f"{where} {name_of(g)}", rep)
    if replicas and not gateways and where.split()[0] != "base":
        pass  # a replica-only render is allowed (none ships today)

    # Services: selectors hit pods, target ports exist on them.
    for s in services.values():
        at = f"{where} {name_of(s)}"
        sel = s["spec"].get("selector")
        hit = [o for o in workloads if o["metadata"].get("namespace") == s["metadata"].get("namespace")
               and selects(sel, pod_labels(o))]
        if not hit:
            rep.error(at, f"selector {sel} selects no pod template of this render")
            continue
        for p in s["spec"].get("ports", []):
            tp = p.get("targetPort", p["port"])
            for o in hit:
                if not any(port_number(c, tp) for c in pod_spec(o)["containers"]):
                    rep.error(at, f"port {p.get('name')}: targetPort {tp!r} is not a port of {name_of(o)}")
    for pdb in (o for o in objs if o.get("kind") == "PodDisruptionBudget"):
        sel = pdb["spec"].get("selector", {}).get("matchLabels")
        if not any(selects(sel, pod_labels(o)) for o in workloads):
            rep.error(f"{where} {name_of(pdb)}", f"selector {sel} selects no pods")
    for sp in (o for o in objs if o.get("kind") == "ServingPool"):
        check_servingpool(sp, objs, services, f"{where} {name_of(sp)}", rep)


def check_serve_container(o: dict, c: dict, cfg: dict, at: str, rep: Report) -> None:
    spec = pod_spec(o)
    port = cfg["port"]
    if cfg["host"] not in ("0.0.0.0", "::"):
        rep.error(at, f"binds {cfg['host']}: probes and peers cannot reach it (use --host=0.0.0.0)")
    declared = {p["containerPort"] for p in c.get("ports", []) or []}
    if port not in declared:
        rep.error(at, f"sluice listens on {port} but the container declares ports {sorted(declared)}")
    paths = cfg["paths"]
    want = {"readinessProbe": {paths["ready"]}, "livenessProbe": {paths["health"]},
            "startupProbe": {paths["ready"], paths["health"]}}
    for probe, ok in want.items():
        p = c.get(probe)
        if p is None:
            if probe != "startupProbe" or cfg.get("model"):
                rep.error(at, f"no {probe}")
            continue
        http = p.get("httpGet")
        if not http:
            rep.error(at, f"{probe} is not an HTTP probe of {sorted(ok)}")
            continue
        if http.get("path") not in ok:
            rep.error(at, f"{probe} path {http.get('path')!r}: sluice serves {sorted(ok)} for it")
        if port_number(c, http.get("port")) != port:
            rep.error(at, f"{probe} port {http.get('port')!r} is not sluice's port {port}")
    grace = spec.get("terminationGracePeriodSeconds", 30)
    pre = ((c.get("lifecycle") or {}).get("preStop") or {}).get("sleep", {}).get("seconds", 0)
    if grace <= pre + cfg["drain_timeout_s"]:
        rep.error(at, f"terminationGracePeriodSeconds {grace} does not outlast preStop {pre} s + "
                      f"--drain-timeout {cfg['drain_timeout_s']:g} s: in-flight streams would be killed")
    if cfg.get("model"):
        sp = c.get("startupProbe") or {}
        budget = sp.get("periodSeconds", 10) * sp.get("failureThreshold", 3)
        if budget < 300:
            rep.error(at, f"startupProbe allows {budget} s for the model to load; give it at least 300 s")
        mounts = {m["mountPath"].rstrip("/") for m in c.get("volumeMounts", []) or []}
        if str(cfg["model_dir"]).rstrip("/") not in mounts:
            rep.error(at, f"--model-dir {cfg['model_dir']} is not a mounted volume ({sorted(mounts)})")


def gpus_requested(c: dict) -> int:
    res = c.get("resources", {}) or {}
    counts = [int(str((res.get(k) or {}).get("nvidia.com/gpu", 0))) for k in ("limits", "requests")]
    return max(counts)


def check_device(c: dict, cfg: dict, at: str, rep: Report) -> None:
    """GPU pods compute on their GPU, one GPU each; the CPU image never asks for one."""
    device = cfg.get("device", "cpu")
    gpus = gpus_requested(c)
    image = image_name(c["image"])
    if image == "sluice-cuda" or gpus:
        if not cfg.get("model"):
            rep.error(at, f"image {image} with {gpus} GPU(s) runs no model")
        elif not device.startswith("cuda"):
            rep.error(at, f"image {image} with {gpus} GPU(s) runs its model on --device {device}: "
                          "add --device=cuda:0")
        if gpus != 1:
            rep.error(at, f"requests {gpus} nvidia.com/gpu: a replica uses exactly one GPU "
                          "(tensor parallelism is out of scope)")
        if not cfg.get("cuda_in_binary", False):
            rep.note("GPU containers' --check-config ran on a binary without CUDA: the device's "
                     "syntax and placement are checked, not that CUDA works")
    elif device.startswith("cuda"):
        rep.error(at, f"image {image} (no CUDA) is given --device {device}")


def check_discovery(g, cfg, services, replicas, gateways, objs, at, rep) -> None:
    ns = g["metadata"].get("namespace")
    for src in cfg["discovery"]:
        if src["kind"] != "k8s":
            rep.error(at, f"discovers replicas through {src['kind']}, not the headless Service (k8s://)")
            continue
        if src["namespace"] != ns:
            rep.error(at, f"k8s://{src['namespace']}/… is not the gateway's namespace {ns}")
        svc = services.get((src["namespace"], src["service"]))
        if svc is None:
            rep.error(at, f"discovery target Service {src['namespace']}/{src['service']} is not in this render")
            continue
        if svc["spec"].get("clusterIP") != "None":
            rep.error(at, f"Service {src['service']} is not headless (clusterIP: None)")
        ports = svc["spec"].get("ports", [])
        if not any(p.get("name") == src["port"] or p.get("port") == src["port"] for p in ports):
            rep.error(at, f"Service {src['service']} has no port {src['port']!r}")
        sel = svc["spec"].get("selector")
        for r in replicas:
            if not selects(sel, pod_labels(r)):
                rep.error(at, f"Service {src['service']} does not select replica {name_of(r)}")
        for other in gateways:
            if selects(sel, pod_labels(other)):
                rep.error(at, f"Service {src['service']} selects gateway {name_of(other)}: it would route to itself")
        if not replicas:
            rep.error(at, "discovers replicas but this render has no replica Deployment")
        check_endpointslice_rbac(g, src["namespace"], objs, at, rep)
    if cfg.get("health_check_path") != cfg["paths"]["ready"]:
        rep.error(at, f"--health-path {cfg.get('health_check_path')!r}: sluice replicas are ready at "
                      f"{cfg['paths']['ready']} (/health answers while the model still loads)")


def check_models_annotation(cfg, services, replicas, serve, at, rep) -> None:
    """The discovered Service's `sluice.dev/models` annotation is what the gateway lists and holds
    requests for while the pool is at zero: it must name exactly the models the replicas serve."""
    served = {s.get("served_model_name") or s["model"]
              for r in replicas for c in pod_spec(r)["containers"]
              if (s := serve.get((r["metadata"]["name"], c["name"])))}
    for src in (d for d in cfg["discovery"] if d["kind"] == "k8s"):
        svc = services.get((src["namespace"], src["service"]))
        if svc is None:
            continue
        raw = (svc["metadata"].get("annotations") or {}).get(MODELS_ANNOTATION)
        if raw is None:
            rep.error(at, f"Service {src['service']} has no {MODELS_ANNOTATION} annotation: the gateway "
                          "cannot list the model or hold its requests while the pool is at zero")
            continue
        named = {m.strip() for m in raw.split(",") if m.strip()}
        if named != served:
            rep.error(at, f"Service {src['service']} annotation {MODELS_ANNOTATION}={raw!r} but the "
                          f"replicas serve {sorted(served)}")


def check_endpointslice_rbac(g, ns, objs, at, rep) -> None:
    sa = pod_spec(g).get("serviceAccountName", "default")
    gns = g["metadata"].get("namespace")
    roles = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o
             for o in objs if o.get("kind") in ("Role", "ClusterRole")}
    for b in (o for o in objs if o.get("kind") in ("RoleBinding", "ClusterRoleBinding")):
        if b["kind"] == "RoleBinding" and b["metadata"].get("namespace") != ns:
            continue
        if not any(s.get("kind") == "ServiceAccount" and s.get("name") == sa
                   and s.get("namespace", b["metadata"].get("namespace")) == gns
                   for s in b.get("subjects", [])):
            continue
        ref = b["roleRef"]
        role = roles.get((ref["kind"], b["metadata"].get("namespace") if ref["kind"] == "Role" else None,
                          ref["name"]))
        for rule in (role or {}).get("rules", []):
            if ("discovery.k8s.io" in rule.get("apiGroups", []) and "endpointslices" in rule.get("resources", [])
                    and {"list", "watch"} <= set(rule.get("verbs", []))):
                return
    rep.error(at, f"ServiceAccount {sa} may not list and watch EndpointSlices in {ns}")


_help_cache: dict = {}


def check_autoscaler_args(binary: str, args: list[str], at: str, rep: Report) -> None:
    if not args:
        rep.error(at, "sluice-autoscaler without a subcommand")
        return
    sub = args[0]
    key = (binary, sub)
    if key not in _help_cache:
        out = subprocess.run([binary, sub, "--help"], capture_output=True, text=True)
        _help_cache[key] = (out.returncode, out.stdout + out.stderr)
    rc, text = _help_cache[key]
    if rc != 0 and "unrecognized subcommand" in text:
        if sub == "run":
            rep.note("SKIPPED: sluice-autoscaler has no `run` subcommand in this build (the "
                     "controller is not merged yet): the autoscaler Deployment's flags are unchecked")
        else:
            rep.error(at, f"sluice-autoscaler has no subcommand {sub!r}")
        return
    if rc != 0:
        rep.error(at, f"`sluice-autoscaler {sub} --help` failed: {text.strip()[:200]}")
        return
    for a in args[1:]:
        if a.startswith("--"):
            flag = a.split("=", 1)[0]
            if not re.search(rf"(^|[\s,]){re.escape(flag)}([\s=<,]|$)", text, re.M):
                rep.error(at, f"`sluice-autoscaler {sub}` has no flag {flag}")


def check_servingpool(sp, objs, services, at, rep) -> None:
    ns = sp["metadata"].get("namespace")
    deployments = {(o["metadata"].get("namespace"), o["metadata"]["name"]): o
                   for o in objs if o.get("kind") == "Deployment"}
    for v in sp.get("spec", {}).get("variants", []):
        if (ns, v.get("deployment")) not in deployments:
            rep.error(at, f"variant {v.get('name')}: Deployment {v.get('deployment')} is not in this render")
    scrape = sp.get("spec", {}).get("signals", {}).get("scrape")
    if scrape and (ns, scrape.get("service")) not in services:
        rep.error(at, f"signals.scrape.service {scrape.get('service')} is not in this render")


# ---------------------------------------------------------------------------------------------
# Dashboards and alerts


def code_metric_names() -> set[str]:
    """Metric names spelled in the code: the engine and the gateway register the vLLM names
    through sluice-metrics' constants (metrics/), so that crate counts as where they live."""
    names = set()
    for crate in ("metrics", "gateway", "engine", "autoscaler"):
        for f in (ROOT / crate / "src").rglob("*.rs"):
            names |= set(re.findall(r'"((?:vllm:|sluice_)[a-z0-9_:]+)"', f.read_text()))
    return names


def used_metrics(expr: str) -> set[str]:
    found = set(re.findall(r"(?<![A-Za-z0-9_:\"])([a-z][a-z0-9_]*:[a-z0-9_:]+|sluice_[a-z0-9_]+|kube_[a-z0-9_]+)", expr))
    return {re.sub(r"_(bucket|sum|count)$", "", m) for m in found}


def check_observability(rep: Report, extra: tuple[tuple[str, str], ...] = ()) -> None:
    known = code_metric_names()
    exprs: list[tuple[str, str]] = list(extra)
    dash = json.loads((OBS / "grafana-dashboard.json").read_text())
    for p in dash["panels"]:
        for t in p.get("targets", []):
            exprs.append((f"dashboard panel {p['title']!r}", t["expr"]))
    rules = yaml.safe_load((OBS / "alerts.yaml").read_text())
    recorded = set()
    for g in rules["groups"]:
        for r in g["rules"]:
            if "record" in r:
                recorded.add(r["record"])
            exprs.append((f"alerts {r.get('alert') or r.get('record')}", r["expr"]))
            if not (("alert" in r) ^ ("record" in r)):
                rep.error("alerts.yaml", f"rule needs exactly one of alert/record: {r}")
    autoscaler_has_metrics = any(n.startswith("sluice_autoscaler_") for n in known)
    for where, e in exprs:
        if e.count("(") != e.count(")") or e.count("{") != e.count("}"):
            rep.error(where, f"unbalanced brackets in {e!r}")
        for m in used_metrics(e):
            if m in known or m in recorded or EXTERNAL_METRICS.match(m):
                continue
            if m.startswith("sluice_autoscaler_") and not autoscaler_has_metrics:
                rep.note("SKIPPED: sluice_autoscaler_* names in the dashboard are unchecked: the "
                         "autoscaler exports no metrics in this tree yet (the controller is not merged)")
                continue
            rep.error(where, f"metric {m} is exported by no code in metrics/, gateway/, engine/ or autoscaler/")


# ---------------------------------------------------------------------------------------------


def check_all(renders: dict, bins: dict, crd, schemas: bool = True) -> Report:
    rep = Report()
    for d, objs in renders.items():
        where = str(d.relative_to(K8S))
        if schemas:
            validate_schemas(objs, where, rep, crd)
        check_consistency(objs, where, rep, bins)
    check_observability(rep)
    return rep


def self_test(renders: dict, bins: dict, crd) -> list[str]:
    """Each break must be reported; returns the ones that were not."""
    base = renders[K8S / "overlays" / "gke-mixed"]

    def find(objs, kind, name):
        return next(o for o in objs if o.get("kind") == kind and o["metadata"]["name"] == name)

    def container(o, name):
        return next(c for c in pod_spec(o)["containers"] if c["name"] == name)

    def b_discover_wrong_service(objs):
        c = container(find(objs, "Deployment", "sluice-gateway"), "gateway")
        c["args"] = [a.replace("sluice-replicas", "sluice-replica") for a in c["args"]]

    def b_unknown_flag(objs):
        container(find(objs, "Deployment", "sluice-replica-l4"), "replica")["args"].append("--max-seqs=8")

    def b_invalid_value(objs):
        # (Not one the args set: a flag wins over its variable.)
        container(find(objs, "Deployment", "sluice-replica-l4"), "replica")["env"].append(
            {"name": "SLUICE_QUEUE_TIMEOUT", "value": "soon"})

    def b_probe_port(objs):
        container(find(objs, "Deployment", "sluice-replica-h100"), "replica")["readinessProbe"]["httpGet"]["port"] = 8080

    def b_probe_path(objs):
        container(find(objs, "Deployment", "sluice-gateway"), "gateway")["livenessProbe"]["httpGet"]["path"] = "/healthz"

    def b_grace(objs):
        # A flag beats the variable: the Spot variant's 15 s drain would silently become 60 s.
        container(find(objs, "Deployment", "sluice-replica-l4-spot"), "replica")["args"].append("--drain-timeout=60s")

    def b_headless(objs):
        del find(objs, "Service", "sluice-replicas")["spec"]["clusterIP"]

    def b_selector(objs):
        find(objs, "Service", "sluice-replicas")["spec"]["selector"]["app.kubernetes.io/component"] = "replicas"

    def b_rbac(objs):
        find(objs, "Role", "sluice-gateway")["rules"][0]["verbs"] = ["get"]

    def b_schema(objs):
        find(objs, "Deployment", "sluice-gateway")["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}

    def b_model_dir(objs):
        c = container(find(objs, "Deployment", "sluice-replica-h100-spot"), "replica")
        c["args"] = [a.replace("--model-dir=/models", "--model-dir=/model") for a in c["args"]]

    def b_servingpool(objs):
        find(objs, "ServingPool", "sluice")["spec"]["variants"][0]["deployment"] = "sluice-replica-a100"

    def b_crd_field(objs):
        find(objs, "ServingPool", "sluice")["spec"]["variants"][0]["maxReplica"] = 3

    def b_gpu_on_cpu(objs):
        c = container(find(objs, "Deployment", "sluice-replica-h100"), "replica")
        c["args"] = [a for a in c["args"] if not a.startswith("--device")]

    def b_bad_device(objs):
        c = container(find(objs, "Deployment", "sluice-replica-l4"), "replica")
        c["args"] = [a.replace("--device=cuda:0", "--device=gpu:0") for a in c["args"]]

    def b_models_annotation(objs):
        find(objs, "Service", "sluice-replicas")["metadata"]["annotations"][MODELS_ANNOTATION] = "llama-3-8b"

    def b_two_gpus(objs):
        c = container(find(objs, "Deployment", "sluice-replica-h100-spot"), "replica")
        c["resources"]["limits"]["nvidia.com/gpu"] = "2"

    breaks = [b_gpu_on_cpu, b_bad_device, b_two_gpus, b_discover_wrong_service, b_unknown_flag, b_invalid_value, b_probe_port, b_probe_path,
              b_grace, b_headless, b_selector, b_rbac, b_schema, b_model_dir, b_servingpool,
              b_models_annotation]
    if crd is not None:
        breaks.append(b_crd_field)
    missed = []
    for b in breaks:
        objs = copy.deepcopy(base)
        b(objs)
        rep = Report()
        validate_schemas(objs, "self-test", rep, crd)
        check_consistency(objs, "self-test", rep, bins)
        if not rep.errors:
            missed.append(b.__name__)
        else:
            print(f"  self-test {b.__name__[2:]}: caught ({rep.errors[0][:140]})")
    rep = Report()
    check_observability(rep, extra=(("self-test", "sum(rate(vllm:generation_token_total[1m]))"),))
    if rep.errors:
        print(f"  self-test metric_name: caught ({rep.errors[0][:140]})")
    else:
        missed.append("b_metric_name")
    return missed


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kubectl", default="kubectl")
    ap.add_argument("--sluice", required=True)
    ap.add_argument("--autoscaler", required=True)
    ap.add_argument("--self-test", action="store_true")
    a = ap.parse_args()
    bins = {"sluice": a.sluice, "sluice-autoscaler": a.autoscaler}
    crd = load_crd()
    renders = {}
    for d in kustomizations():
        renders[d] = render(a.kubectl, d)
        print(f"  rendered {d.relative_to(ROOT)}: {len(renders[d])} objects")
    rep = check_all(renders, bins, crd)
    # The controller's own examples next to its CRD must validate too.
    for ex in sorted((K8S / "crd").glob("example-*.yaml")) if crd is not None else []:
        for o in (d for d in yaml.safe_load_all(ex.read_text()) if d):
            for e in crd_errors(o, crd):
                rep.error(f"{ex.relative_to(ROOT)} {name_of(o)}", e)
    for n in rep.notes:
        print(f"  note: {n}")
    if rep.errors:
        print(f"check-deploy: {len(rep.errors)} problem(s):", file=sys.stderr)
        for e in rep.errors:
            print(f"  {e}", file=sys.stderr)
        return 1
    n = sum(len(o) for o in renders.values())
    print(f"check-deploy: {len(renders)} kustomizations, {n} objects: schemas (Kubernetes "
          f"{', '.join(K8S_VERSIONS)}), binaries and metric names agree")
    if a.self_test:
        missed = self_test(renders, bins, crd)
        if missed:
            print(f"check-deploy self-test: these deliberate breaks went unnoticed: {missed}", file=sys.stderr)
            return 1
        print("check-deploy self-test: every deliberate break was reported")
    return 0


if __name__ == "__main__":
    sys.exit(main())
