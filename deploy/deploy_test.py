#!/usr/bin/env python3
"""//deploy:deploy_test: checks deploy/ against the real binaries.

Usage: deploy_test.py SWITCHYARD_COORDINATOR SWITCHYARD_WORKER SYCTL   (Bazel passes all three)

1. Every YAML file (all documents, duplicate keys rejected) and the dashboard JSON parse;
   kustomization resources exist; `kubectl kustomize` (when installed) renders the base and
   base + tls component to exactly what this test reads.
1b. Worker manifests are per job: `syctl k8s-workers --job-file` for two fixture jobs (with and
   without training.load, plain and --tls-secret) gives Indexed batch/v1 Jobs whose checkpoint
   mounts are only subPaths (the job's own directory read-write, the loaded job's read-only);
   they are the worker workloads of the checks below; no worker pod anywhere under deploy/
   mounts the checkpoint volume without a subPath.
2. Manifests hang together: namespaces, Service selectors and named ports, Secret and PVC
   references, StatefulSet serviceName, the workers' --coordinator = Service:grpc port, the
   coordinator's --advertise-address, --metrics-port = the container's metrics port, the probe
   ports, the shared /dev/shm and /checkpoints mounts, NCCL_NVLS_ENABLE=0, the workers'
   --checkpoint-root and --data-root equal to the coordinator's, the data root mounted read-only.
3. GPUs: nvidia.com/gpu only in limits, exactly 1 per worker container, none on the coordinator.
4. Every --flag in the containers' args (base and with the tls component's patches applied) is
   one the binary lists in --help.
5. The real coordinator is started with the manifest's args (paths and ports replaced by temp
   ones); the gRPC health services the probes name answer SERVING (grpc.health.v1.Health/Check,
   as the kubelet calls it), a bogus one does not; /healthz; /metrics scraped.
6. A real worker is started with a generated worker Job's args minus --job (--device cpu, temp
   token, free metrics port,
   the coordinator's temp roots), attaches, trains a tiny mock-data job submitted over REST; its
   /metrics is scraped while the job trains; after the job is cancelled, the idle worker's step
   gauges read 0 and its per-layer series are gone. Then a job-scoped worker: a second job, its
   manifest from `syctl k8s-workers` asking the real coordinator (which created the job's
   directory 0700), a worker with that manifest's args trains it to SUCCEEDED and exits 0; the
   same args again, a missing and a malformed --job exit 1 naming --job.
   With the tls component: the coordinator over TLS, its gRPC probes on the plaintext
   --health-port, a worker
   attaching with --tls-root-cert (self-signed certificate from openssl).
   With Debian's prometheus package: promtool checks the dashboard PromQL and prometheus.yml, and a
   real Prometheus scrapes both processes and evaluates every dashboard query, each of which must
   return series (no exception for a CPU worker).
7. Every metric the dashboard's PromQL uses is one the scrapes saw, and every metric
   worker/agent/worker_metrics.cc registers is exported by the CPU worker (MFU included: 0 on
   CPU); every label the dashboard groups by, matches on or prints is one the series carry or
   prometheus.yml adds.
8. prometheus.yml keeps exactly the coordinator's http port and the workers' metrics ports.
9. Grafana provisioning matches the dashboard (datasource uid); Dockerfile: Debian 12 base,
   non-root uid = the manifests' runAsUser, the Debian packages it installs own every shared
   library `ldd` resolves for both binaries here (Debian 12), CUDA sonames are the ones its
   CUDA packages provide.
10. Alerts (prometheus/alerts.yml): promtool check rules, promtool test rules alerts_test.yml with
   a firing and a non-firing case for every alert, every metric and label scraped (the
   validation loss from a job with training.eval_interval), the rules loaded into the live Prometheus and
   each of their selectors returning series. Grafana: a per-layer expert-load heatmap and a
   queue panel, their queries run like the others.
11. Kubernetes: every object (base, base + tls as kubectl renders them, the token template, the
   worker Jobs syctl prints offline and from the real coordinator) validates against the
   Kubernetes 1.27.0 and 1.32.0 OpenAPI schemas (kubernetes-validate, strict); the kustomization
   uses only fields this test's own renderer implements (used without kubectl); every pod is
   non-root, no privilege escalation, capabilities dropped, read-only root file system.
Every check ("ok:" / "FAIL:" / "SKIP:") goes to deploy_test.log in the test's undeclared outputs
(bazel-testlogs/deploy/deploy_test/test.outputs/); standard output carries everything but the
"ok:" lines, so a failure is near the top of what CI shows. Exits 1 if any check failed.
"""
import copy
import glob
import json
import os
import re
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
import traceback
import urllib.error
import urllib.parse
import urllib.request

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
TMP = os.environ.get("TEST_TMPDIR") or "/tmp/deploy_test"
os.makedirs(TMP, exist_ok=True)
FAILURES = []
CHECKS = [0]


class _Log:
    """Standard output for this test: everything to the full log file, all but "ok:" lines to
    the real stdout (the passing checks are hundreds of lines; the failures are what CI shows)."""

    def __init__(self, path):
        self.full = open(path, "w")
        self.out = sys.__stdout__
        self.line = ""

    def write(self, text):
        self.full.write(text)
        self.line += text
        while "\n" in self.line:
            head, self.line = self.line.split("\n", 1)
            if not head.startswith("ok:   "):
                self.out.write(head + "\n")
        return len(text)

    def flush(self):
        self.full.flush()
        self.out.flush()


def check(cond, what):
    CHECKS[0] += 1
    print(("ok:   " if cond else "FAIL: ") + what, flush=True)
    if not cond:
        FAILURES.append(what)
    return cond


def section(title):
    print("\n=== " + title, flush=True)


class StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects a key given twice in one mapping (PyYAML keeps the last silently;
    kubectl and kustomize reject it)."""


def _strict_mapping(loader, node, deep=False):
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, "key %r defined twice" % (key,), key_node.start_mark)
        seen.add(key)
    return yaml.SafeLoader.construct_mapping(loader, node, deep)


StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _strict_mapping)


def rel(path):
    return os.path.relpath(path, HERE)


# --------------------------------------------------------------------------------------------
# 1. Parse everything.
# --------------------------------------------------------------------------------------------
def load_all():
    section("parse YAML and JSON")
    docs = {}
    files = sorted(glob.glob(os.path.join(HERE, "**", "*.y*ml"), recursive=True))
    check(len(files) >= 8, "found %d YAML files under deploy/" % len(files))
    for f in files:
        try:
            with open(f) as fh:
                d = [x for x in yaml.load_all(fh, Loader=StrictLoader) if x is not None]
            docs[rel(f)] = d
            kinds = ", ".join(str(x.get("kind", "-")) for x in d if isinstance(x, dict))
            check(len(d) >= 1, "%s: %d document(s) [%s]" % (rel(f), len(d), kinds))
        except yaml.YAMLError as e:
            check(False, "%s does not parse: %s" % (rel(f), e))
    dashboards = {}
    for f in sorted(glob.glob(os.path.join(HERE, "grafana", "**", "*.json"), recursive=True)):
        try:
            with open(f) as fh:
                dashboards[rel(f)] = json.load(fh)
            check(True, "%s parses (%d panels)" % (rel(f), len(dashboards[rel(f)]["panels"])))
        except (ValueError, KeyError) as e:
            check(False, "%s does not parse: %s" % (rel(f), e))
    check(len(dashboards) >= 1, "found %d dashboard(s)" % len(dashboards))
    return docs, dashboards


# --------------------------------------------------------------------------------------------
# JSON patch (RFC 6902 add/replace/remove), enough for the tls component.
# --------------------------------------------------------------------------------------------
def json_patch(obj, ops):
    obj = copy.deepcopy(obj)
    for op in ops:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        parent = obj
        for p in parts[:-1]:
            parent = parent[int(p)] if isinstance(parent, list) else parent[p]
        last = parts[-1]
        if op["op"] == "add":
            if isinstance(parent, list):
                if last == "-":
                    parent.append(op["value"])
                else:
                    parent.insert(int(last), op["value"])
            else:
                parent[last] = op["value"]
        elif op["op"] == "replace":
            if isinstance(parent, list):
                parent[int(last)] = op["value"]
            else:
                if last not in parent:
                    raise KeyError("replace of missing " + op["path"])
                parent[last] = op["value"]
        elif op["op"] == "remove":
            del parent[int(last) if isinstance(parent, list) else last]
        else:
            raise ValueError("unsupported op " + op["op"])
    return obj


# --------------------------------------------------------------------------------------------
# 2./3. The manifests.
# --------------------------------------------------------------------------------------------
def manifests(docs):
    section("kustomization and manifests")
    kpath = "kubernetes/kustomization.yaml"
    kust = docs[kpath][0]
    ns = kust.get("namespace")
    check(ns == "switchyard", "kustomization namespace is %r" % ns)
    objects = []
    listed = set()
    for r in kust.get("resources", []):
        p = os.path.join("kubernetes", r)
        listed.add(p)
        if check(p in docs, "resource %s exists and parses" % p):
            objects.extend(docs[p])
    for p in docs:
        if p.startswith("kubernetes/") and p.count("/") == 1 and p not in (kpath, TOKEN_TEMPLATE):
            check(p in listed, "%s is listed in kustomization resources" % p)
    # The token Secret template must stay out: a re-apply would reset the real token to it.
    check(TOKEN_TEMPLATE in docs and TOKEN_TEMPLATE not in listed,
          "%s exists and is not a kustomization resource" % TOKEN_TEMPLATE)
    for o in docs.get(TOKEN_TEMPLATE, []):
        check(o["kind"] == "Secret" and o["metadata"].get("namespace") == ns,
              "%s: %s/%s in namespace %s" % (TOKEN_TEMPLATE, o["kind"], o["metadata"]["name"],
                                             o["metadata"].get("namespace")))
    for img in kust.get("images", []):
        check(img.get("name") == "switchyard", "kustomization images rewrites %r" % img.get("name"))
    check_kustomization_fields(kust, docs.get("kubernetes/tls/kustomization.yaml", [{}])[0])
    by = {}
    for o in objects:
        k = (o["kind"], o["metadata"]["name"])
        check(k not in by, "%s/%s defined once" % k)
        by[k] = o
        if o["kind"] != "Namespace":
            check(o["metadata"].get("namespace") == ns,
                  "%s/%s in namespace %s" % (k[0], k[1], o["metadata"].get("namespace")))
    check(("Namespace", ns) in by, "Namespace %s defined" % ns)

    # tls component: a kustomize Component whose JSON patches apply to the base objects.
    tls = docs.get("kubernetes/tls/kustomization.yaml", [None])[0]
    tls_by = dict(by)
    if check(tls is not None and tls.get("kind") == "Component", "tls/ is a kustomize Component"):
        for p in tls.get("patches", []):
            key = (p["target"]["kind"], p["target"]["name"])
            if not check(key in by, "tls patch target %s/%s exists" % key):
                continue
            try:
                tls_by[key] = json_patch(tls_by[key], yaml.safe_load(p["patch"]))
                check(True, "tls patch applies to %s/%s" % key)
            except (KeyError, IndexError, ValueError) as e:
                check(False, "tls patch on %s/%s: %s" % (key[0], key[1], e))
    by, tls_by = own_render(by, kust), own_render(tls_by, kust)
    return kustomize_render(by, tls_by)


# The kustomization fields this test's own renderer implements (own_render, the tls patches in
# manifests()); any other field fails, so the reading can never silently differ from kustomize's
# for a field it ignores. This is not kubectl's renderer: where kubectl is installed,
# kustomize_render() compares the two and uses kubectl's output.
KUSTOMIZATION_FIELDS = {
    "Kustomization": {"apiVersion", "kind", "namespace", "resources", "images"},
    "Component": {"apiVersion", "kind", "patches"},
}
IMAGE_FIELDS = {"name", "newName", "newTag"}
PATCH_FIELDS = {"target", "patch"}
TARGET_FIELDS = {"kind", "name"}


def check_kustomization_fields(kust, tls):
    for what, k in (("kubernetes/kustomization.yaml", kust),
                    ("kubernetes/tls/kustomization.yaml", tls)):
        allowed = KUSTOMIZATION_FIELDS.get(k.get("kind"), set())
        extra = sorted(set(k) - allowed)
        check(bool(allowed) and not extra, "%s (%s): fields %s are all implemented by this "
              "test's renderer%s" % (what, k.get("kind"), sorted(k), (" (not: %s)" % extra)
                                     if extra else ""))
    bad = [sorted(set(i) - IMAGE_FIELDS) for i in kust.get("images", []) if set(i) - IMAGE_FIELDS]
    bad += [sorted(set(p) - PATCH_FIELDS) for p in tls.get("patches", []) if set(p) - PATCH_FIELDS]
    bad += [sorted(set(p.get("target", {})) - TARGET_FIELDS) for p in tls.get("patches", [])
            if set(p.get("target", {})) - TARGET_FIELDS]
    check(not bad, "images / patches / targets use only implemented fields%s" % (
        (" (not: %s)" % bad) if bad else ""))


CLUSTER_SCOPED = {"Namespace", "PersistentVolume", "ClusterRole", "ClusterRoleBinding",
                  "StorageClass", "CustomResourceDefinition"}


def own_render(by, kust):
    """The kustomization's namespace and images transforms over the resources' objects (what
    kustomize does for these two fields: metadata.namespace of namespaced objects, the image
    name:tag of every container whose image name is `name`)."""
    out = {}
    ns = kust.get("namespace")
    for key, o in by.items():
        o = copy.deepcopy(o)
        if ns and o["kind"] not in CLUSTER_SCOPED:
            o["metadata"]["namespace"] = ns
        if o["kind"] in ("StatefulSet", "Job", "DaemonSet", "Deployment"):
            spec = pod_spec(o)
            for c in spec.get("containers", []) + spec.get("initContainers", []):
                name, _, tag = c["image"].partition(":")
                for img in kust.get("images", []):
                    if img["name"] == name:
                        c["image"] = "%s:%s" % (img.get("newName", name), img.get("newTag", tag))
        out[key] = o
    return out


def kustomize_render(by, tls_by):
    """`kubectl kustomize` (kustomize built into kubectl), when installed: the base must render to
    exactly the objects of the files, and base + tls component to what the patches above gave;
    the rendered tls objects are then the ones checked."""
    section("kubectl kustomize")
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        print("SKIP: no kubectl: the kustomization is rendered by this test's own renderer "
              "(own_render: namespace, images, the tls patches), not kubectl's")
        return by, tls_by
    work = os.path.join(TMP, "kustomize")
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(os.path.join(HERE, "kubernetes"), os.path.join(work, "kubernetes"))
    os.makedirs(os.path.join(work, "overlay"))
    with open(os.path.join(work, "overlay", "kustomization.yaml"), "w") as f:
        f.write("resources: [../kubernetes]\ncomponents: [../kubernetes/tls]\n")
    rendered = {}
    for name, path in (("base", "kubernetes"), ("tls", "overlay")):
        r = subprocess.run([kubectl, "kustomize", os.path.join(work, path)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if not check(r.returncode == 0, "kubectl kustomize %s: exit %d %s" %
                     (name, r.returncode, r.stderr.strip()[-500:])):
            return by, tls_by
        rendered[name] = {(o["kind"], o["metadata"]["name"]): o
                          for o in yaml.safe_load_all(r.stdout) if o}
        print("%s renders %d objects" % (name, len(rendered[name])))

    def norm(o):  # kustomize writes 0440 as 288 and sorts keys; compare as JSON
        return json.dumps(o, sort_keys=True)

    for name, mine in (("base", by), ("tls", tls_by)):
        got = rendered[name]
        check(set(got) == set(mine), "%s: kustomize renders the same objects %s" %
              (name, sorted("%s/%s" % k for k in got)))
        diff = [k for k in mine if k in got and norm(got[k]) != norm(mine[k])]
        check(not diff, "%s: every rendered object equals this test's reading%s" %
              (name, (" (differs: %s)" % diff) if diff else ""))
    return rendered["base"], rendered["tls"]


TOKEN_TEMPLATE = "kubernetes/token-secret.yaml"


def with_token_secret(by, docs):
    """The objects plus the token Secret of the template (created by hand in a cluster)."""
    out = dict(by)
    for o in docs.get(TOKEN_TEMPLATE, []):
        out[(o["kind"], o["metadata"]["name"])] = o
    return out


def container_args(c):
    out = {}
    for a in c.get("args", []):
        if a.startswith("--"):
            name, _, value = a[2:].partition("=")
            out[name.replace("-", "_")] = value
    return out


def pod_spec(o):
    return o["spec"]["template"]["spec"]


def coordinator_and_workers(by):
    coord = [o for o in by.values() if o["kind"] == "StatefulSet" and
             o["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/component") ==
             "coordinator"]
    workers = [o for o in by.values() if o["kind"] in ("StatefulSet", "Job", "DaemonSet") and
               o["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/component") ==
               "worker"]
    return coord, workers


def check_manifests(by):
    section("manifest consistency and GPU requests")
    coord_list, worker_list = coordinator_and_workers(by)
    check(len(coord_list) == 1, "one coordinator StatefulSet")
    check(len(worker_list) >= 1, "a worker workload")
    coord = coord_list[0]
    check(coord["spec"].get("replicas") == 1, "coordinator replicas = 1 (one SQLite writer)")
    cspec = pod_spec(coord)
    cc = cspec["containers"][0]
    cargs = container_args(cc)
    cports = {p["name"]: p["containerPort"] for p in cc.get("ports", [])}
    check(cargs.get("grpc_port") == str(cports.get("grpc")),
          "--grpc-port %s = containerPort grpc %s" % (cargs.get("grpc_port"), cports.get("grpc")))
    check(cargs.get("http_port") == str(cports.get("http")),
          "--http-port %s = containerPort http %s" % (cargs.get("http_port"), cports.get("http")))
    check(all(c["image"].startswith("switchyard:") for o in by.values()
              if o["kind"] in ("StatefulSet", "Job", "DaemonSet")
              for c in pod_spec(o)["containers"]), "every container image is switchyard:<version>")

    # Services: selectors match a pod template, targetPorts are named ports of it.
    svc = {}
    for (kind, name), o in by.items():
        if kind != "Service":
            continue
        svc[name] = o
        sel = o["spec"].get("selector", {})
        pods = [w for w in by.values() if w["kind"] in ("StatefulSet", "Job", "DaemonSet") and
                all(w["spec"]["template"]["metadata"]["labels"].get(k) == v
                    for k, v in sel.items())]
        check(len(pods) >= 1, "Service %s selects %d workload(s)" % (name, len(pods)))
        for port in o["spec"].get("ports", []):
            tp = port.get("targetPort", port["port"])
            names = {p["name"]: p["containerPort"] for w in pods for c in pod_spec(w)["containers"]
                     for p in c.get("ports", [])}
            check(tp in names or tp in names.values(),
                  "Service %s port %s targets container port %s" % (name, port["name"], tp))
    for o in by.values():
        if o["kind"] == "StatefulSet":
            check(o["spec"]["serviceName"] in svc,
                  "StatefulSet %s serviceName %s exists" % (o["metadata"]["name"],
                                                            o["spec"]["serviceName"]))
            sel = o["spec"]["selector"]["matchLabels"]
            labels = o["spec"]["template"]["metadata"]["labels"]
            check(all(labels.get(k) == v for k, v in sel.items()),
                  "StatefulSet %s selector matches its template" % o["metadata"]["name"])
    coord_svc = [s for s in svc.values() if s["spec"].get("clusterIP") != "None" and
                 s["spec"]["selector"].get("app.kubernetes.io/component") == "coordinator"]
    check(len(coord_svc) == 1, "one ClusterIP Service for the coordinator")
    cs = coord_svc[0]
    cs_grpc = [p["port"] for p in cs["spec"]["ports"] if p["name"] == "grpc"]
    coord_addr = "%s:%s" % (cs["metadata"]["name"], cs_grpc[0] if cs_grpc else "?")
    check(cargs.get("advertise_address") == coord_addr,
          "coordinator --advertise-address %s = Service %s" % (cargs.get("advertise_address"),
                                                               coord_addr))

    # Probes: native grpc on the gRPC port.
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        p = cc.get(probe, {})
        check("grpc" in p and str(p["grpc"].get("port")) == cargs.get("grpc_port"),
              "coordinator %s is a grpc probe on --grpc-port (%s)" % (probe, p.get("grpc")))

    # Secrets, PVCs, mounts.
    def volume_sources(spec):
        return {v["name"]: v for v in spec.get("volumes", [])}

    def mount_for(c, spec, path):
        """The volume (and sub-path) that holds `path` in container c."""
        best = None
        for m in c.get("volumeMounts", []):
            mp = m["mountPath"].rstrip("/")
            if path == mp or path.startswith(mp + "/"):
                if best is None or len(mp) > len(best[0]):
                    best = (mp, m)
        if best is None:
            return None, None
        vols = volume_sources(spec)
        return vols.get(best[1]["name"]), path[len(best[0]):].lstrip("/")

    def check_token(c, spec, who, flag="token_file", want_secret=None):
        vol, sub = mount_for(c, spec, container_args(c).get(flag, ""))
        ok = vol is not None and "secret" in vol
        name = vol["secret"]["secretName"] if ok else None
        if ok:
            secret = by.get(("Secret", name))
            ok = secret is not None and sub in (secret.get("stringData") or {}) | (
                secret.get("data") or {})
        if want_secret is not None:
            ok = ok and name == want_secret
        check(ok, "%s --%s %s is key %r of Secret %s%s" % (
            who, flag.replace("_", "-"), container_args(c).get(flag), sub, name,
            "" if want_secret is None else " (want %s)" % want_secret))

    # Users and workers have distinct tokens (coordinator/api/auth.h): the coordinator reads both
    # Secrets, each worker only the workers' one.
    check_token(cc, cspec, "coordinator", "token_file", "switchyard-token")
    check_token(cc, cspec, "coordinator", "worker_token_file", "switchyard-worker-token")
    vct = {t["metadata"]["name"]: t for t in coord["spec"].get("volumeClaimTemplates", [])}
    store_mount = [m for m in cc.get("volumeMounts", []) if m["name"] in vct and
                   cargs.get("store", "").startswith(m["mountPath"].rstrip("/") + "/")]
    check(len(store_mount) == 1 and
          vct[store_mount[0]["name"]]["spec"]["accessModes"] == ["ReadWriteOnce"],
          "coordinator --store %s is on its ReadWriteOnce volumeClaimTemplate" % cargs.get("store"))
    check(not any("nvidia.com/gpu" in (cc.get("resources", {}).get(s) or {})
                  for s in ("limits", "requests")), "coordinator asks for no GPU")

    worker_containers = 0
    for w in worker_list:
        spec = pod_spec(w)
        vols = volume_sources(spec)
        wname = w["metadata"]["name"]
        ann = w["spec"]["template"]["metadata"].get("annotations", {})
        check(ann.get("prometheus.io/scrape") == "true", "%s pods annotated prometheus.io/scrape"
              % wname)
        all_ports = [p["containerPort"] for c in spec["containers"] for p in c.get("ports", [])]
        check(len(all_ports) == len(set(all_ports)),
              "%s: container ports unique within the pod (shared network namespace): %s"
              % (wname, all_ports))
        for v in vols.values():
            if "persistentVolumeClaim" in v:
                claim = by.get(("PersistentVolumeClaim", v["persistentVolumeClaim"]["claimName"]))
                check(claim is not None and "ReadWriteMany" in claim["spec"]["accessModes"],
                      "%s volume %s -> ReadWriteMany PVC %s" %
                      (wname, v["name"], v["persistentVolumeClaim"]["claimName"]))
        for c in spec["containers"]:
            who = "%s/%s" % (wname, c["name"])
            worker_containers += 1
            a = container_args(c)
            res = c.get("resources", {})
            lim = (res.get("limits") or {}).get("nvidia.com/gpu")
            check(str(lim) == "1", "%s: limits nvidia.com/gpu = %s (want 1)" % (who, lim))
            check("nvidia.com/gpu" not in (res.get("requests") or {}),
                  "%s: nvidia.com/gpu not in requests" % who)
            check(a.get("coordinator") == coord_addr,
                  "%s: --coordinator %s = %s" % (who, a.get("coordinator"), coord_addr))
            check_token(c, spec, who, "token_file", "switchyard-worker-token")
            ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
            mports = [v for k, v in ports.items() if k.startswith("metrics")]
            check(len(mports) == 1 and a.get("metrics_port") == str(mports[0]),
                  "%s: --metrics-port %s = its metrics containerPort %s" %
                  (who, a.get("metrics_port"), mports))
            env = {e["name"]: e.get("value") for e in c.get("env", [])}
            check(env.get("NCCL_NVLS_ENABLE") == "0", "%s: NCCL_NVLS_ENABLE=0" % who)
            shm, _ = mount_for(c, spec, "/dev/shm")
            check(shm is not None and shm.get("emptyDir", {}).get("medium") == "Memory",
                  "%s: /dev/shm is a memory-backed emptyDir" % who)
            # Job-scoped pods (syctl k8s-workers): the checkpoint PVC only at the job's own
            # directory (read-write) and at a loaded job's (read-only), never its root.
            root = cargs.get("checkpoint_root", "/checkpoints").rstrip("/")
            own = "%s/%s" % (root, a.get("job", "?"))
            ck, sub = mount_for(c, spec, own + "/x")
            check(ck is not None and "persistentVolumeClaim" in ck and sub == "x",
                  "%s: --job %s's directory %s is a mount of a shared PVC" % (who, a.get("job"),
                                                                             own))
            for m in c.get("volumeMounts", []):
                v = vols.get(m["name"], {})
                if v.get("persistentVolumeClaim", {}).get("claimName") != "switchyard-checkpoints":
                    continue
                sp = m.get("subPath", "")
                check(sp.startswith("jobs/") and m["mountPath"].rstrip("/") == root + "/" + sp,
                      "%s: checkpoint volume mounted at %s with subPath %r (= the path under "
                      "--checkpoint-root)" % (who, m["mountPath"], sp))
                check((m.get("readOnly") is True) == (sp != a.get("job")),
                      "%s: subPath %s is %s" % (who, sp, "read-write (its job)" if
                                                sp == a.get("job") else "read-only"))
            # Job paths (common/config/job_paths.h): the worker confines each assignment to its own
            # roots, which must be the coordinator's, and the data root is mounted read-only.
            for root in ("checkpoint_root", "data_root"):
                check(cargs.get(root) is not None and a.get(root) == cargs.get(root),
                      "%s: --%s %s = the coordinator's %s" %
                      (who, root.replace("_", "-"), a.get(root), cargs.get(root)))
            data_mounts = [m for m in c.get("volumeMounts", [])
                           if (cargs.get("data_root") or "/data").rstrip("/") + "/x"
                           == m["mountPath"].rstrip("/") + "/x"]
            dv, _ = mount_for(c, spec, (cargs.get("data_root") or "/data") + "/x")
            check(len(data_mounts) == 1 and data_mounts[0].get("readOnly") is True and
                  dv is not None and
                  dv.get("persistentVolumeClaim", {}).get("readOnly") is True,
                  "%s: the data root %s is a read-only mount of a read-only PVC" %
                  (who, cargs.get("data_root")))
            for ref in re.findall(r"\$\((\w+)\)", " ".join(c.get("args", []))):
                check(ref in env or any(e["name"] == ref for e in c.get("env", [])),
                      "%s: $(%s) in args is an env var of the container" % (who, ref))
    check(worker_containers >= 1, "%d worker containers, each one GPU" % worker_containers)
    return coord, worker_list, coord_addr


# --------------------------------------------------------------------------------------------
# 2b. Worker manifests: generated per job by `syctl k8s-workers` (cli/k8s_workers.h).
# --------------------------------------------------------------------------------------------
FIXTURE_JOBS = {
    # A PENDING job needing 2 workers, no training.load.
    "jobs/7": {"name": "jobs/7", "state": "PENDING",
               "spec": {"display_name": "fixture", "min_workers": 2, "max_workers": 4}},
    # One loading another job's checkpoint: that job's directory is mounted read-only.
    "jobs/8": {"name": "jobs/8", "state": "PENDING",
               "spec": {"parallel": {"world_size": 1},
                        "training": {"load": "jobs/3/step_600"}}},
}


def k8s_workers(syctl, job, extra=()):
    """The objects `syctl k8s-workers JOB --job-file FIXTURE` prints (offline), or None."""
    path = os.path.join(TMP, "%s.json" % job.replace("/", "-"))
    with open(path, "w") as f:
        json.dump(FIXTURE_JOBS[job], f)
    r = subprocess.run([syctl, "k8s-workers", job, "--job-file", path] + list(extra),
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    if not check(r.returncode == 0, "syctl k8s-workers %s %s: exit %d %s" % (
            job, " ".join(extra), r.returncode, r.stderr.strip())):
        return None
    try:
        objs = [o for o in yaml.load_all(r.stdout, Loader=StrictLoader) if o]
    except yaml.YAMLError as e:
        check(False, "syctl k8s-workers %s prints YAML: %s" % (job, e))
        return None
    return objs, r.stdout


def check_worker_job(o, job, want_workers, loaded):
    """The shape of one generated worker Job (what a cluster runs per job)."""
    name = o["metadata"]["name"]
    check(o["apiVersion"] == "batch/v1" and o["kind"] == "Job", "%s: a batch/v1 Job" % name)
    spec = o["spec"]
    check(spec.get("completionMode") == "Indexed", "%s: completionMode Indexed" % name)
    check(spec.get("parallelism") == want_workers and spec.get("completions") == want_workers,
          "%s: parallelism = completions = %s (want %d, the workers %s needs)" % (
              name, (spec.get("parallelism"), spec.get("completions")), want_workers, job))
    pod = pod_spec(o)
    # A podFailurePolicy needs restartPolicy Never; it fails the Job on the permanent worker
    # exits 1-127 (DESIGN.md) instead of retrying them.
    check(pod.get("restartPolicy") == "Never", "%s: restartPolicy Never" % name)
    rules = spec.get("podFailurePolicy", {}).get("rules", [])
    fail = [r for r in rules if r.get("action") == "FailJob"]
    codes = fail[0].get("onExitCodes", {}) if fail else {}
    check(codes.get("operator") == "In" and codes.get("values") == list(range(1, 128)),
          "%s: podFailurePolicy FailJob on exit codes 1-127 (got %s)" % (name, codes))
    check(len(pod["containers"]) == 1, "%s: one container (one GPU) per pod" % name)
    c = pod["containers"][0]
    a = container_args(c)
    check(a.get("job") == job, "%s: --job %s" % (name, a.get("job")))
    vols = {v["name"]: v for v in pod.get("volumes", [])}
    mounts = [(m, vols.get(m["name"], {})) for m in c.get("volumeMounts", [])]
    ck = [(m.get("subPath"), m["mountPath"], bool(m.get("readOnly")))
          for m, v in mounts
          if v.get("persistentVolumeClaim", {}).get("claimName") == "switchyard-checkpoints"]
    want = [(job, "/checkpoints/" + job, False)]
    if loaded:
        want.append((loaded, "/checkpoints/" + loaded, True))
    check(ck == want, "%s: checkpoint mounts (subPath, mountPath, readOnly) %s (want %s)" % (
        name, ck, want))


def render_with_kubectl(name, text):
    """`kubectl kustomize` over a kustomization holding the generated manifest: it must render to
    the same object (offline; `kubectl apply --dry-run` needs a cluster)."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        print("SKIP: no kubectl for %s" % name)
        return
    work = os.path.join(TMP, "kustomize-" + name)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    with open(os.path.join(work, "workers.yaml"), "w") as f:
        f.write(text)
    with open(os.path.join(work, "kustomization.yaml"), "w") as f:
        f.write("resources: [workers.yaml]\n")
    r = subprocess.run([kubectl, "kustomize", work], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
    if check(r.returncode == 0, "kubectl kustomize of %s: exit %d %s" % (
            name, r.returncode, r.stderr.strip()[-300:])):
        got = [o for o in yaml.safe_load_all(r.stdout) if o]
        mine = [o for o in yaml.safe_load_all(text) if o]
        check(json.dumps(got, sort_keys=True) == json.dumps(mine, sort_keys=True),
              "kubectl kustomize renders %s unchanged" % name)


def generated_workers(syctl):
    """The per-job worker Jobs of the fixtures, plain and for the tls component."""
    section("syctl k8s-workers: per-job worker manifests")
    base, tls = {}, {}
    for job, want, loaded in (("jobs/7", 2, ""), ("jobs/8", 1, "jobs/3")):
        out = k8s_workers(syctl, job)
        if out is None:
            continue
        objs, text = out
        check(len(objs) == 1, "syctl k8s-workers %s: one object" % job)
        for o in objs:
            check_worker_job(o, job, want, loaded)
            base[(o["kind"], o["metadata"]["name"])] = o
        render_with_kubectl(job.replace("/", "-"), text)
        out = k8s_workers(syctl, job, ["--tls-secret", "switchyard-tls"])
        if out is not None:
            for o in out[0]:
                check("--tls-root-cert=/etc/switchyard/tls/ca.crt" in
                      pod_spec(o)["containers"][0]["args"], "%s --tls-secret: --tls-root-cert"
                      % job)
                tls[(o["kind"], o["metadata"]["name"])] = o
    # Bad input is refused, naming the option (exit 2), and a missing job file fails (exit 1).
    for args, code, word in ((["--namespace", "Bad_NS"], 2, "--namespace"),
                             (["--image", "a b"], 2, "--image")):
        path = os.path.join(TMP, "jobs-7.json")
        r = subprocess.run([syctl, "k8s-workers", "jobs/7", "--job-file", path] + args,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
        check(r.returncode == code and word in r.stderr and not r.stdout,
              "syctl k8s-workers %s: exit %d, %r" % (" ".join(args), r.returncode,
                                                     r.stderr.strip()))
    return base, tls


# --------------------------------------------------------------------------------------------
# 2c. Kubernetes OpenAPI schemas (kubernetes-validate) and the pods' security context.
# --------------------------------------------------------------------------------------------
# The versions deploy/README.md names: 1.27 (the oldest supported: native gRPC probes GA) and the
# newest kubernetes-validate==KUBERNETES_VALIDATE bundles. Strict: unknown fields fail too.
KUBERNETES_VERSIONS = ("1.27.0", "1.32.0")
KUBERNETES_VALIDATE = "1.32.0"  # = tools/setup.sh PYPI_PACKAGES
LIVE_WORKER_JOBS = {}  # the worker Job syctl rendered from the real coordinator (run_scoped_worker)


def check_schemas(sets):
    """Every object of every (label, {key: object}) set validates against the OpenAPI schemas of
    KUBERNETES_VERSIONS (strict). Required: the package is installed by tools/setup.sh."""
    section("Kubernetes OpenAPI schemas (kubernetes-validate, strict)")
    try:
        import kubernetes_validate
        from kubernetes_validate import version as kv_version
    except ImportError as e:
        check(False, "kubernetes-validate is installed (tools/setup.sh): %s" % e)
        return
    have = getattr(kv_version, "__version__", "?")
    check(have == KUBERNETES_VALIDATE, "kubernetes-validate %s (pinned %s)" % (
        have, KUBERNETES_VALIDATE))
    count = 0
    for label, objs in sets:
        for key, o in sorted(objs.items()):
            for v in KUBERNETES_VERSIONS:
                try:
                    kubernetes_validate.validate(o, v, strict=True)
                    err = None
                except kubernetes_validate.ValidationError as e:
                    err = "%s at %s" % (e.message[:300], "/".join(str(x) for x in e.path))
                except (kubernetes_validate.SchemaNotFoundError,
                        kubernetes_validate.InvalidSchemaError) as e:
                    err = "no schema: %s" % e
                count += 1
                check(err is None, "%s %s/%s validates against Kubernetes %s%s" % (
                    label, key[0], key[1], v, (": " + err) if err else ""))
    check(count >= 20, "%d (object, version) validations" % count)
    # The validation can fail: a misspelt field and a mistyped value are rejected.
    sts = next((o for objs in (s for _, s in sets) for o in objs.values()
                if o["kind"] == "StatefulSet"), None)
    if check(sts is not None, "a StatefulSet to mutate"):
        for what, mutate in (
                ("a misspelt container field", lambda o: pod_spec(o)["containers"][0].update(
                    {"securityContxt": {}})),
                ("replicas as a string", lambda o: o["spec"].update({"replicas": "1"}))):
            bad = copy.deepcopy(sts)
            mutate(bad)
            try:
                kubernetes_validate.validate(bad, KUBERNETES_VERSIONS[0], strict=True)
                rejected = False
            except kubernetes_validate.ValidationError:
                rejected = True
            check(rejected, "kubernetes-validate rejects %s" % what)


def check_security(sets):
    """Every pod template (coordinator, generated worker Jobs, with and without tls): non-root,
    no privilege escalation, all capabilities dropped, read-only root file system."""
    section("pod security context")
    pods = 0
    for label, objs in sets:
        for o in objs.values():
            if o["kind"] not in ("StatefulSet", "Job", "DaemonSet", "Deployment"):
                continue
            pods += 1
            spec = pod_spec(o)
            who = "%s %s/%s" % (label, o["kind"], o["metadata"]["name"])
            psc = spec.get("securityContext") or {}
            check(psc.get("runAsNonRoot") is True and isinstance(psc.get("runAsUser"), int)
                  and psc["runAsUser"] != 0 and psc.get("runAsGroup", 1) != 0,
                  "%s: pod runAsNonRoot, runAsUser %s, runAsGroup %s" % (
                      who, psc.get("runAsUser"), psc.get("runAsGroup")))
            for c in spec.get("containers", []) + spec.get("initContainers", []):
                sc = c.get("securityContext") or {}
                check(sc.get("allowPrivilegeEscalation") is False,
                      "%s/%s: allowPrivilegeEscalation false" % (who, c["name"]))
                check(sc.get("readOnlyRootFilesystem") is True,
                      "%s/%s: readOnlyRootFilesystem true" % (who, c["name"]))
                check("ALL" in (sc.get("capabilities") or {}).get("drop", []) and
                      not (sc.get("capabilities") or {}).get("add") and not sc.get("privileged"),
                      "%s/%s: capabilities drop ALL, none added, not privileged" % (who,
                                                                                 c["name"]))
    check(pods >= 6, "%d pod templates checked" % pods)


def check_no_root_mounts(docs, generated):
    """No worker pod anywhere in deploy/ (nor a generated one) mounts the checkpoint volume
    without a subPath; only the coordinator mounts its root."""
    section("no worker pod mounts the checkpoint volume's root")
    objs = [o for d in docs.values() for o in d if isinstance(o, dict)] + list(generated.values())
    pods = 0
    for o in objs:
        if o.get("kind") not in ("StatefulSet", "Job", "DaemonSet", "Deployment", "Pod"):
            continue
        tmpl = o["spec"] if o["kind"] == "Pod" else o["spec"]["template"]["spec"]
        labels = (o.get("metadata", {}).get("labels") or {}) if o["kind"] == "Pod" else \
            o["spec"]["template"]["metadata"].get("labels", {})
        ck = {v["name"] for v in tmpl.get("volumes", [])
              if v.get("persistentVolumeClaim", {}).get("claimName") == "switchyard-checkpoints"}
        for c in tmpl.get("containers", []) + tmpl.get("initContainers", []):
            for m in c.get("volumeMounts", []):
                if m["name"] not in ck:
                    continue
                who = "%s/%s/%s" % (o["kind"], o["metadata"]["name"], c["name"])
                if labels.get("app.kubernetes.io/component") == "coordinator":
                    print("note: %s (the coordinator) mounts the root at %s" % (who,
                                                                              m["mountPath"]))
                    continue
                pods += 1
                check(bool(m.get("subPath")), "%s mounts the checkpoint volume with subPath %r"
                      % (who, m.get("subPath")))
    check(pods >= 3, "%d worker checkpoint mounts checked" % pods)


# --------------------------------------------------------------------------------------------
# 4. Flags against --help.
# --------------------------------------------------------------------------------------------
def help_flags(binary):
    p = subprocess.run([binary, "--help"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=60)
    names = set(re.findall(r"^\s+--([a-z][a-z0-9_-]*)", p.stdout, re.M))
    return {n.replace("-", "_") for n in names}


def check_flags(by, tls_by, coordinator_bin, worker_bin):
    section("container args are flags the binaries accept (--help)")
    known = {"switchyard-coordinator": help_flags(coordinator_bin),
             "switchyard-worker": help_flags(worker_bin)}
    for b, f in known.items():
        check(len(f) >= 8, "%s --help lists %d flags" % (b, len(f)))
    for label, objs in (("base", by), ("tls", tls_by)):
        for o in objs.values():
            if o["kind"] not in ("StatefulSet", "Job", "DaemonSet"):
                continue
            for c in pod_spec(o)["containers"]:
                binary = os.path.basename(c.get("command", ["?"])[0])
                if not check(binary in known, "%s %s/%s runs %s" %
                             (label, o["metadata"]["name"], c["name"], binary)):
                    continue
                bad = []
                for name in container_args(c):
                    if name not in known[binary] and not (
                            name.startswith("no") and name[2:] in known[binary]):
                        bad.append(name)
                check(not bad, "%s %s/%s: %d flags known to %s%s" % (
                    label, o["metadata"]["name"], c["name"], len(container_args(c)), binary,
                    (", unknown: " + ", ".join(bad)) if bad else ""))
    # A flag that does not exist must fail the same check (the check can fail).
    check("no_such_flag" not in known["switchyard-worker"], "a bogus flag is not accepted")


# --------------------------------------------------------------------------------------------
# gRPC health check over cleartext HTTP/2, as the kubelet's grpc probe sends it.
# --------------------------------------------------------------------------------------------
def _frame(ftype, flags, stream, payload):
    return struct.pack(">I", len(payload))[1:] + bytes([ftype, flags]) + struct.pack(
        ">I", stream) + payload


def _hpack_literal(name, value):
    name, value = name.encode(), value.encode()
    assert len(name) < 127 and len(value) < 127
    return b"\x00" + bytes([len(name)]) + name + bytes([len(value)]) + value


def grpc_health_check(host, port, service, timeout=15.0):
    """Returns the ServingStatus (1 SERVING, 2 NOT_SERVING) or None when there is no response
    message (e.g. NOT_FOUND for an unknown service)."""
    s = socket.create_connection((host, port), timeout=timeout)
    try:
        msg = b""
        if service:
            sb = service.encode()
            msg = b"\x0a" + bytes([len(sb)]) + sb
        headers = b"".join(_hpack_literal(k, v) for k, v in (
            (":method", "POST"), (":scheme", "http"), (":path", "/grpc.health.v1.Health/Check"),
            (":authority", "%s:%d" % (host, port)), ("content-type", "application/grpc"),
            ("te", "trailers")))
        s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + _frame(4, 0, 0, b"") +
                  _frame(1, 4, 1, headers) +
                  _frame(0, 1, 1, b"\x00" + struct.pack(">I", len(msg)) + msg))
        buf, data = b"", b""
        deadline = time.time() + timeout
        while time.time() < deadline:
            while len(buf) >= 9:
                length = struct.unpack(">I", b"\x00" + buf[:3])[0]
                if len(buf) < 9 + length:
                    break
                ftype, flags = buf[3], buf[4]
                stream = struct.unpack(">I", buf[5:9])[0] & 0x7FFFFFFF
                payload, buf = buf[9:9 + length], buf[9 + length:]
                if ftype == 4 and not flags & 1:
                    s.sendall(_frame(4, 1, 0, b""))  # ACK the server's SETTINGS
                elif ftype == 0 and stream == 1:
                    data += payload
                elif ftype in (3, 7):  # RST_STREAM, GOAWAY
                    return None
                if ftype in (0, 1) and stream == 1 and flags & 1:  # END_STREAM
                    if len(data) >= 5:
                        body = data[5:]
                        if body[:1] == b"\x08":
                            return body[1]
                        return 0  # UNKNOWN (field absent)
                    return None
            r, _, _ = select.select([s], [], [], 0.2)
            if r:
                chunk = s.recv(65536)
                if not chunk:
                    return None
                buf += chunk
        return None
    finally:
        s.close()


# --------------------------------------------------------------------------------------------
# 5.-6. Run the binaries with the manifests' args.
# --------------------------------------------------------------------------------------------
PROCS = []


HANDED_OUT = set()


def free_port():
    """A port nothing listens on and this test has not handed out before (the kernel may give the
    same ephemeral port to two bind(0) calls in a row once the first socket is closed)."""
    held = []
    try:
        while True:
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            held.append(s)
            p = s.getsockname()[1]
            if p not in HANDED_OUT:
                HANDED_OUT.add(p)
                return p
    finally:
        for s in held:
            s.close()


def http_get(url, token=None, timeout=10, attempts=3):
    """(status, body); (HTTP error code, body) for an HTTP error; (None, reason) when the server
    cannot be reached or does not answer in `timeout` s, after `attempts` tries one second apart
    (a loaded CI machine: the callers' loops and checks decide, never an exception)."""
    req = urllib.request.Request(url)
    if token:
        req.add_header("authorization", "Bearer " + token)
    reason = ""
    for i in range(attempts):
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()
        except OSError as e:  # URLError, refused, reset, timed out
            reason = "%s: %s" % (type(e).__name__, e)
        if i + 1 < attempts:
            time.sleep(1)
    return None, reason


def http_post(url, body, token):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    req.add_header("authorization", "Bearer " + token)
    req.add_header("content-type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError as e:
        return None, "%s: %s" % (type(e).__name__, e)


def parse_exposition(text):
    """{sample name: set of label names}, and {family: type}."""
    samples, types = {}, {}
    for line in text.splitlines():
        m = re.match(r"# TYPE (\S+) (\S+)", line)
        if m:
            types[m.group(1)] = m.group(2)
            continue
        if not line or line.startswith("#"):
            continue
        m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^}]*)\})?\s", line)
        if m:
            labels = set(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="', m.group(3) or ""))
            samples.setdefault(m.group(1), set()).update(labels)
    return samples, types


def substituted(args, repl):
    """args with --name=value replaced for the names in repl; returns (args, changed names)."""
    out, changed = [], []
    for a in args:
        name = a[2:].partition("=")[0].replace("-", "_") if a.startswith("--") else None
        if name in repl:
            out.append("--%s=%s" % (a[2:].partition("=")[0], repl[name]))
            changed.append(name)
        else:
            out.append(a)
    return out, changed


def run_binaries(coord, workers, coordinator_bin, worker_bin, syctl_bin):
    section("the real coordinator with the manifest's args")
    token = "deploy-test-" + os.urandom(8).hex()
    token_file = os.path.join(TMP, "token")
    with open(token_file, "w") as f:
        f.write(token + "\n")
    worker_token_file = os.path.join(TMP, "worker-token")
    with open(worker_token_file, "w") as f:
        f.write("deploy-test-worker-" + os.urandom(8).hex() + "\n")
    cc = pod_spec(coord)["containers"][0]
    grpc_port, http_port = free_port(), free_port()
    args, changed = substituted(cc["args"], {
        "store": os.path.join(TMP, "store.db"), "token_file": token_file,
        "worker_token_file": worker_token_file, "host": "127.0.0.1",
        "store_backup": os.path.join(TMP, "store.backup.db"),
        "grpc_port": grpc_port, "http_port": http_port,
        "advertise_address": "127.0.0.1:%d" % grpc_port,
        "checkpoint_root": os.path.join(TMP, "checkpoints"), "data_root": os.path.join(TMP, "data")})
    kept = [a for a in args if a[2:].partition("=")[0].replace("-", "_") not in changed]
    print("replaced for this machine: %s; kept as in the manifest: %s" % (changed, kept))
    log = open(os.path.join(TMP, "coordinator.log"), "w+")
    p = subprocess.Popen([coordinator_bin] + args, stdout=log, stderr=subprocess.STDOUT)
    PROCS.append(p)
    up = False
    deadline = time.time() + 60
    while time.time() < deadline:
        log.seek(0)
        if "listening grpc=" in log.read():
            up = True
            break
        if p.poll() is not None:
            break
        time.sleep(0.1)
    log.seek(0)
    if not check(up, "coordinator starts with the manifest's args"):
        print(log.read())
        return None
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        service = cc[probe]["grpc"].get("service", "")
        st = grpc_health_check("127.0.0.1", grpc_port, service)
        check(st == 1, "%s: Health/Check(%r) = %s (1 = SERVING)" % (probe, service, st))
    st = grpc_health_check("127.0.0.1", grpc_port, "switchyard.v1.NoSuchService")
    check(st != 1, "Health/Check('switchyard.v1.NoSuchService') is not SERVING (%s)" % st)
    status, body = http_get("http://127.0.0.1:%d/healthz" % http_port)
    check(status == 200 and body.strip() == "ok", "GET /healthz: %s %r" % (status, body.strip()))
    status, body = http_get("http://127.0.0.1:%d/v1/jobs" % http_port, token)
    check(status == 200, "GET /v1/jobs with the token file's token: %s %s" % (
        status, "" if status == 200 else body[:300]))

    section("a real CPU worker with a generated worker Job's args (unscoped), one training job")
    w = workers[0]
    wc = pod_spec(w)["containers"][0]
    metrics_port = free_port()
    # Without --job here: the idle worker's gauges are read after its job is cancelled (a scoped
    # worker would leave then); the scoped worker runs below (run_scoped_worker).
    unscoped = [a for a in wc["args"] if not a.startswith("--job=")]
    wargs, wchanged = substituted(unscoped, {
        "coordinator": "127.0.0.1:%d" % grpc_port, "token_file": worker_token_file,
        "device": "cpu", "metrics_port": metrics_port, "gloo_host": "127.0.0.1",
        "checkpoint_root": os.path.join(TMP, "checkpoints"), "data_root": os.path.join(TMP, "data")})
    wkept = [a for a in wargs if a[2:].partition("=")[0].replace("-", "_") not in wchanged]
    print("replaced for this machine: %s; kept as in the manifest: %s" % (wchanged, wkept))
    wlog = open(os.path.join(TMP, "worker.log"), "w+")
    env = dict(os.environ)
    env.update({e["name"]: e["value"] for e in wc.get("env", []) if "value" in e})
    wp = subprocess.Popen([worker_bin] + wargs, stdout=wlog, stderr=subprocess.STDOUT, env=env)
    PROCS.append(wp)
    coord_url = "http://127.0.0.1:%d" % http_port
    attached = False
    deadline = time.time() + 60
    while time.time() < deadline:
        _, text = http_get(coord_url + "/metrics")
        m = re.search(r"^switchyard_coordinator_workers_attached (\S+)", text, re.M)
        if m and float(m.group(1)) >= 1:
            attached = True
            break
        if wp.poll() is not None:
            break
        time.sleep(0.1)
    if not check(attached, "worker attaches (switchyard_coordinator_workers_attached >= 1)"):
        wlog.seek(0)
        print(wlog.read())
        return [http_get(coord_url + "/metrics")[1]]
    spec = {
        "display_name": "deploy-test",
        "model": {"num_layers": 2, "hidden_size": 32, "num_attention_heads": 4,
                  "num_query_groups": 2, "ffn_hidden_size": 48, "seq_length": 16,
                  "vocab_size": 64, "num_experts": 4, "moe_router_topk": 2,
                  "moe_ffn_hidden_size": 24, "moe_router_load_balancing_type": "aux_loss",
                  "moe_aux_loss_coeff": 0.01},
        # Runs until cancelled: the scrapes and the dashboard queries happen while it trains
        # (an idle worker exports no job's numbers), the reset is checked after the cancel.
        # eval_interval: the worker exports switchyard_job_validation_loss from step 2 on (mock
        # valid batches), for the dashboard's validation panel and the alert rule.
        "training": {"micro_batch_size": 2, "global_batch_size": 4, "train_iters": 10000000,
                     "lr": 0.003, "eval_interval": 2, "eval_iters": 1},
        "data": {"mock_data": True},
        "min_workers": 1, "max_workers": 1}
    status, body = http_post(coord_url + "/v1/jobs", {"spec": spec, "request_id": "deploy-1"},
                             token)
    if not check(status == 200, "POST /v1/jobs: %s" % status):
        print(body)
        return [http_get(coord_url + "/metrics")[1]]
    job = json.loads(body)
    print("job %s state %s" % (job.get("name"), job.get("state")))
    worker_url = "http://127.0.0.1:%d/metrics" % metrics_port
    worker_text, state, step = "", "", 0.0
    deadline = time.time() + 180
    while time.time() < deadline:
        st, jb = http_get(coord_url + "/v1/" + job["name"], token)
        state = json.loads(jb).get("state") if st == 200 else "GET %s: %s" % (st, jb[:200])
        _, worker_text = http_get(worker_url)
        m = re.search(r"^switchyard_worker_step (\S+)", worker_text, re.M)
        step = float(m.group(1)) if m else 0.0
        if state in ("SUCCEEDED", "FAILED", "CANCELLED") or (state == "RUNNING" and step >= 2):
            break
        time.sleep(0.1)
    if not check(state == "RUNNING" and step >= 2,
                 "the job trains on the worker: %s, switchyard_worker_step %g" % (state, step)):
        wlog.seek(0)
        print(wlog.read()[-3000:])
    _, coord_text = http_get(coord_url + "/metrics")
    wlog.seek(0)
    log_lines = [l for l in wlog.read().splitlines() if l.strip()]
    print("worker log (last lines):\n  " + "\n  ".join(log_lines[-4:]))
    DASHBOARD_QUERIES_RUN.append(prometheus_queries(http_port, metrics_port))
    check_idle_worker_metrics(coord_url, token, job["name"], worker_url)
    wp.terminate()
    check(wp.wait(timeout=60) == 0, "the unscoped worker exits 0 after SIGTERM")
    run_scoped_worker(coord_url, token, token_file, worker_token_file, grpc_port, worker_bin,
                      syctl_bin, spec)
    return [coord_text, worker_text]


def run_scoped_worker(coord_url, token, token_file, worker_token_file, grpc_port, worker_bin,
                      syctl_bin, spec):
    """A job submitted to the real coordinator, its manifest from `syctl k8s-workers` (asking the
    coordinator), and a real worker with the manifest's args (--job included): the job SUCCEEDS
    and the worker exits 0; the same args once the job is finished, and --job naming a missing
    job, exit 1 naming --job."""
    section("a job-scoped worker from syctl k8s-workers, against the real coordinator")
    spec = dict(spec, display_name="deploy-test-scoped",
                training=dict(spec["training"], train_iters=3))
    status, body = http_post(coord_url + "/v1/jobs", {"spec": spec, "request_id": "deploy-2"},
                             token)
    if not check(status == 200, "POST /v1/jobs (scoped): %s %s" % (status, body[:300])):
        return
    name = json.loads(body)["name"]
    job_dir = os.path.join(TMP, "checkpoints", name)
    st = os.stat(job_dir) if os.path.isdir(job_dir) else None
    check(st is not None and (st.st_mode & 0o777) == 0o700,
          "the coordinator created %s at CreateJob, mode %s" % (
              job_dir, oct(st.st_mode & 0o777) if st else None))
    r = subprocess.run([syctl_bin, "--coordinator", "127.0.0.1:%d" % grpc_port, "--token-file",
                        token_file, "k8s-workers", name], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=60)
    if not check(r.returncode == 0, "syctl k8s-workers %s (from the coordinator): exit %d %s" % (
            name, r.returncode, r.stderr.strip())):
        return
    objs = [o for o in yaml.safe_load_all(r.stdout) if o]
    check(len(objs) == 1, "one object")
    check_worker_job(objs[0], name, 1, "")
    LIVE_WORKER_JOBS[(objs[0]["kind"], objs[0]["metadata"]["name"])] = objs[0]
    render_with_kubectl("live", r.stdout)
    wc = pod_spec(objs[0])["containers"][0]
    root = os.path.join(TMP, "checkpoints")
    wargs, wchanged = substituted(wc["args"], {
        "coordinator": "127.0.0.1:%d" % grpc_port, "token_file": worker_token_file,
        "device": "cpu", "metrics_port": free_port(), "gloo_host": "127.0.0.1",
        "checkpoint_root": root, "data_root": os.path.join(TMP, "data")})
    print("replaced for this machine: %s; kept: %s" % (wchanged, [
        a for a in wargs if a[2:].partition("=")[0].replace("-", "_") not in wchanged]))
    env = dict(os.environ)
    env.update({e["name"]: e["value"] for e in wc.get("env", []) if "value" in e})

    def run_worker(args, log_name, timeout):
        log = open(os.path.join(TMP, log_name), "w+")
        p = subprocess.Popen([worker_bin] + args, stdout=log, stderr=subprocess.STDOUT, env=env)
        PROCS.append(p)
        try:
            code = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            code = None
        log.seek(0)
        return code, log.read()

    code, text = run_worker(wargs, "scoped-worker.log", 180)
    st, jb = http_get(coord_url + "/v1/" + name, token)
    state = json.loads(jb).get("state") if st == 200 else st
    check(state == "SUCCEEDED", "%s ran on its scoped worker: %s" % (name, state))
    if not check(code == 0 and "ended SUCCEEDED" in text,
                 "the scoped worker exits 0 by itself once %s ended (exit %s): %s" % (
                     name, code, [l for l in text.splitlines() if "ended" in l][-1:])):
        print(text[-3000:])
    code, text = run_worker(wargs, "scoped-again.log", 60)
    check(code == 1 and "--job " + name in text and "SUCCEEDED" in text,
          "the same pod started again: exit %s naming --job (%s)" % (
              code, text.strip().splitlines()[-1:] if text.strip() else ""))
    missing, _ = substituted(wargs, {"job": "jobs/999"})
    code, text = run_worker(missing, "scoped-missing.log", 60)
    check(code == 1 and "--job jobs/999" in text,
          "--job jobs/999 (no such job): exit %s naming --job (%s)" % (
              code, text.strip().splitlines()[-1:] if text.strip() else ""))
    bad, _ = substituted(wargs, {"job": "jobs/x"})
    code, text = run_worker(bad, "scoped-bad.log", 60)
    check(code == 1 and "--job" in text,
          "--job jobs/x (malformed): exit %s naming --job at startup (%s)" % (
              code, text.strip().splitlines()[-1:] if text.strip() else ""))


def check_idle_worker_metrics(coord_url, token, job_name, worker_url):
    """Cancels the running job; the idle worker's /metrics then keeps none of its numbers: every
    step gauge is 0 and the per-layer series are gone (worker/agent/worker_metrics.h)."""
    section("the worker's /metrics after its job ended")
    status, body = http_post(coord_url + "/v1/" + job_name + ":cancel", {}, token)
    check(status == 200, "POST /v1/%s:cancel: %s %s" % (job_name, status,
                                                       "" if status == 200 else body[:300]))
    text, generation = "", None
    deadline = time.time() + 60
    while time.time() < deadline:
        _, text = http_get(worker_url)
        m = re.search(r"^switchyard_worker_generation (\S+)", text, re.M)
        generation = float(m.group(1)) if m else None
        if generation == 0:
            break
        time.sleep(0.1)
    if not check(generation == 0, "the worker is idle (switchyard_worker_generation %s)" %
                 generation):
        return
    samples, _ = parse_exposition(text)
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            series, _, value = line.rpartition(" ")
            values[series] = float(value)
    for name in ("switchyard_worker_step", "switchyard_worker_step_seconds",
                 "switchyard_worker_tokens_per_second", "switchyard_worker_tflops",
                 "switchyard_worker_mfu", "switchyard_worker_loss", "switchyard_worker_aux_loss",
                 "switchyard_worker_grad_norm", "switchyard_worker_lr"):
        check(values.get(name) == 0, "idle worker: %s = %s (reset to 0)" % (name,
                                                                          values.get(name)))
    left = sorted(n for n in values if n.startswith("switchyard_worker_expert_"))
    check(not left, "idle worker: no per-layer expert series left (%s)" % (left or "none"))


DASHBOARDS = {}
DASHBOARD_QUERIES_RUN = []


def dashboard_exprs(d):
    """(title, expr with the Grafana variables replaced) of every panel query."""
    out = []
    for p in d["panels"]:
        for t in p.get("targets", []):
            e = (t["expr"].replace("$__rate_interval", "1m").replace("$__range", "5m")
                 .replace("$job", "switchyard-.*").replace("$instance", ".*"))
            out.append((p["title"], e))
    return out


def prometheus_queries(coord_http_port, worker_metrics_port):
    """A real Prometheus (Debian's package, when installed) scrapes the running coordinator and
    worker under the scrape job names of prometheus.yml while the worker trains; every dashboard
    query must evaluate and return series (a CPU worker exports every dashboard metric)."""
    section("dashboard queries in a real Prometheus")
    prom = shutil.which("prometheus")
    if prom is None:
        print("SKIP: no prometheus binary (Debian package prometheus): queries not evaluated")
        return False
    port = free_port()
    cfg = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
           "scrape_configs": [
               {"job_name": "switchyard-coordinator",
                "static_configs": [{"targets": ["127.0.0.1:%d" % coord_http_port]}]},
               {"job_name": "switchyard-worker",
                "static_configs": [{"targets": ["127.0.0.1:%d" % worker_metrics_port]}]}],
           # The shipped alert rules, evaluated every second against the live series.
           "rule_files": [ALERTS_PATH]}
    cfg_path = os.path.join(TMP, "prometheus-test.yml")
    with open(cfg_path, "w") as f:
        yaml.safe_dump(cfg, f)
    log = open(os.path.join(TMP, "prometheus.log"), "w+")
    p = subprocess.Popen([prom, "--config.file=" + cfg_path,
                          "--storage.tsdb.path=" + os.path.join(TMP, "prometheus-data"),
                          "--web.listen-address=127.0.0.1:%d" % port],
                         stdout=log, stderr=subprocess.STDOUT)
    PROCS.append(p)
    base = "http://127.0.0.1:%d" % port

    def query(q):
        url = base + "/api/v1/query?" + urllib.parse.urlencode({"query": q})
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                return json.loads(r.read().decode())
        except urllib.error.HTTPError as e:
            body = e.read().decode(errors="replace")
            try:
                return json.loads(body)
            except ValueError:  # e.g. 503 in plain text while Prometheus starts
                return {"status": "error", "error": "HTTP %d: %s" % (e.code, body[:200])}
        except (OSError, ValueError) as e:
            return {"status": "error", "error": str(e)}

    # Ready: 4 samples of `up` per target, and the latest scrape of both succeeded (a scrape that
    # failed on a loaded machine marks every series of that target stale until the next one).
    ready = False
    deadline = time.time() + 120
    while time.time() < deadline:
        r = query('count_over_time(up{job=~"switchyard-.*"}[1m]) >= 4 and '
                  'up{job=~"switchyard-.*"} == 1')
        if r.get("status") == "success" and len(r["data"]["result"]) == 2:
            ready = True
            break
        if p.poll() is not None:
            break
        time.sleep(0.2)
    if not check(ready, "Prometheus %s scraped both targets 4 times" % prom):
        log.seek(0)
        print(log.read()[-3000:])
        return False
    for d in DASHBOARDS.values():
        for title, e in dashboard_exprs(d):
            deadline = time.time() + 20  # an empty answer is retried: a scrape may have failed
            while True:
                r = query(e)
                ok = r.get("status") == "success"
                n = len(r["data"]["result"]) if ok else 0
                if ((ok and n > 0) or r.get("errorType") == "bad_data"
                        or time.time() > deadline):
                    break
                time.sleep(0.5)
            check(ok and n > 0, "%r: %s -> %s, %d series%s" % (
                title, e, r.get("status"), n, r.get("error", "") and " " + r.get("error") or ""))
    live_alert_rules(query, base)
    return True


def live_alert_rules(query, base):
    """alerts.yml loaded into the live Prometheus: every alert rule is evaluated without error
    (health ok), and every series selector in its expression (metric name + label matchers)
    returns series from the running binaries, except the metrics declared not exported yet
    (ALERT_METRICS_NOT_EXPORTED), which must return none."""
    section("alert rules in the live Prometheus")
    alerts = alert_rules()
    deadline = time.time() + 30
    while True:
        try:
            with urllib.request.urlopen(base + "/api/v1/rules?type=alert", timeout=10) as r:
                got = json.loads(r.read().decode())
        except (OSError, ValueError) as e:
            got = {"status": "error", "error": str(e)}
        rules = {}
        for g in got.get("data", {}).get("groups", []) if got.get("status") == "success" else []:
            for rule in g.get("rules", []):
                rules[rule["name"]] = rule
        evaluated = all(rules.get(a["alert"], {}).get("lastEvaluation", "").startswith("20")
                        for a in alerts)
        if (set(rules) >= {a["alert"] for a in alerts} and evaluated) or time.time() > deadline:
            break
        time.sleep(0.5)
    for a in alerts:
        rule = rules.get(a["alert"])
        check(rule is not None and rule.get("health") == "ok" and not rule.get("lastError"),
              "alert %s loaded and evaluated by Prometheus: health %s %s" % (
                  a["alert"], rule and rule.get("health"), rule and rule.get("lastError", "")))
        for sel in alert_selectors(a["expr"]):
            name = re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", sel).group(0)
            deadline = time.time() + 20  # an empty answer is retried: a scrape may have failed
            while True:
                r = query(sel)
                n = len(r["data"]["result"]) if r.get("status") == "success" else 0
                if n > 0 or name in ALERT_METRICS_NOT_EXPORTED or time.time() > deadline:
                    break
                time.sleep(0.5)
            if name in ALERT_METRICS_NOT_EXPORTED:
                check(r.get("status") == "success" and n == 0,
                      "alert %s: %s -> %d series (declared not exported yet; once it is, take "
                      "it out of ALERT_METRICS_NOT_EXPORTED)" % (
                          a["alert"], sel, n))
            else:
                check(n > 0, "alert %s: %s -> %s, %d series (the rule sees live data)" % (
                    a["alert"], sel, r.get("status"), n))


def start_coordinator(args, name):
    """Starts the coordinator; returns the process, or None (log printed) if it did not come up."""
    log = open(os.path.join(TMP, name + ".log"), "w+")
    p = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    PROCS.append(p)
    deadline = time.time() + 60
    while time.time() < deadline:
        log.seek(0)
        if "listening grpc=" in log.read():
            return p
        if p.poll() is not None:
            break
        time.sleep(0.1)
    log.seek(0)
    print(log.read()[-3000:])
    return None


def run_tls(tls_by, coordinator_bin, worker_bin):
    """The tls component for real: a self-signed certificate (openssl) for 127.0.0.1; the
    coordinator with the rendered tls args; the native gRPC probes on its plaintext health port
    (the kubelet's gRPC probe cannot speak TLS); HTTPS /healthz; a worker with a generated TLS
    args (--tls-root-cert) attaching over TLS."""
    section("the tls component: coordinator and worker over TLS")
    if shutil.which("openssl") is None:
        print("SKIP: no openssl: cannot make a test certificate")
        return
    coord, workers = coordinator_and_workers(tls_by)
    cc = pod_spec(coord[0])["containers"][0]
    wc = pod_spec(workers[0])["containers"][0]
    cert, key = os.path.join(TMP, "tls.crt"), os.path.join(TMP, "tls.key")
    r = subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                        "-subj", "/CN=switchyard-coordinator", "-addext",
                        "subjectAltName=DNS:switchyard-coordinator,DNS:localhost,IP:127.0.0.1",
                        "-keyout", key, "-out", cert], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    if not check(r.returncode == 0, "openssl made a self-signed certificate"):
        print(r.stdout)
        return
    for c, flags in ((cc, ("tls_cert", "tls_key")), (wc, ("tls_root_cert",))):
        for flag in flags:
            path = container_args(c).get(flag, "")
            mounts = [m for m in c.get("volumeMounts", [])
                      if path.startswith(m["mountPath"].rstrip("/") + "/")]
            spec = pod_spec(coord[0] if c is cc else workers[0])
            vols = {v["name"]: v for v in spec.get("volumes", [])}
            secret = [vols[m["name"]].get("secret", {}).get("secretName") for m in mounts
                      if m["name"] in vols]
            check(secret == ["switchyard-tls"], "tls: %s --%s %s is in Secret %s" %
                  (c["name"], flag.replace("_", "-"), path, secret))
    token = "deploy-test-tls-" + os.urandom(8).hex()
    token_file = os.path.join(TMP, "tls-token")
    with open(token_file, "w") as f:
        f.write(token)
    worker_token_file = os.path.join(TMP, "tls-worker-token")
    with open(worker_token_file, "w") as f:
        f.write("deploy-test-tls-worker-" + os.urandom(8).hex())
    grpc_port, http_port, health_port = free_port(), free_port(), free_port()
    cargs = container_args(cc)
    cports = {p["name"]: p["containerPort"] for p in cc.get("ports", [])}
    check(cargs.get("health_port") == str(cports.get("health")),
          "tls: --health-port %s = containerPort health %s" % (cargs.get("health_port"),
                                                              cports.get("health")))
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        g = cc[probe].get("grpc", {})
        check(str(g.get("port")) == cargs.get("health_port"),
              "tls %s is a native grpc probe on --health-port (%s)" % (probe, g))
    args, changed = substituted(cc["args"], {
        "store": os.path.join(TMP, "tls-store.db"), "token_file": token_file,
        "worker_token_file": worker_token_file,
        "store_backup": os.path.join(TMP, "tls-store.backup.db"),
        "host": "127.0.0.1", "grpc_port": grpc_port, "http_port": http_port,
        "health_port": health_port, "advertise_address": "127.0.0.1:%d" % grpc_port,
        "checkpoint_root": os.path.join(TMP, "tls-checkpoints"), "tls_cert": cert,
        "tls_key": key})
    print("replaced for this machine: %s" % changed)
    p = start_coordinator([coordinator_bin] + args, "tls-coordinator")
    if not check(p is not None, "coordinator starts with the tls component's args"):
        return
    import ssl
    # The probes as the kubelet sends them: cleartext gRPC Health/Check on the health port.
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        service = cc[probe].get("grpc", {}).get("service", "")
        st = grpc_health_check("127.0.0.1", health_port, service)
        check(st == 1, "tls %s: Health/Check(%r) on the plaintext health port = %s "
              "(1 = SERVING)" % (probe, service, st))
    st = grpc_health_check("127.0.0.1", health_port, "switchyard.v1.NoSuchService")
    check(st != 1, "tls: Health/Check('switchyard.v1.NoSuchService') is not SERVING (%s)" % st)
    try:
        st = grpc_health_check("127.0.0.1", grpc_port, "", timeout=5.0)
    except OSError as e:  # reset by the TLS server
        st = None
    check(st is None, "tls: the TLS gRPC port does not answer a cleartext Health/Check (%s)" % st)
    insecure = ssl.create_default_context()
    insecure.check_hostname = False
    insecure.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen("https://127.0.0.1:%d/healthz" % http_port, timeout=5,
                                    context=insecure) as r:
            status, body = r.status, r.read().decode().strip()
    except OSError as e:
        status, body = None, str(e)
    check(status == 200, "tls: HTTPS GET /healthz -> %s %r" % (status, body))
    metrics_port = free_port()
    wargs, wchanged = substituted(
        [a for a in wc["args"] if not a.startswith("--job=")], {  # no job on this coordinator
        "coordinator": "127.0.0.1:%d" % grpc_port, "token_file": worker_token_file,
        "device": "cpu", "metrics_port": metrics_port, "gloo_host": "127.0.0.1",
        "tls_root_cert": cert})
    print("replaced for this machine: %s" % wchanged)
    wlog = open(os.path.join(TMP, "tls-worker.log"), "w+")
    wp = subprocess.Popen([worker_bin] + wargs, stdout=wlog, stderr=subprocess.STDOUT)
    PROCS.append(wp)
    verified = ssl.create_default_context(cafile=cert)
    attached = False
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            with urllib.request.urlopen("https://127.0.0.1:%d/metrics" % http_port, timeout=5,
                                        context=verified) as r:
                text = r.read().decode()
            m = re.search(r"^switchyard_coordinator_workers_attached (\S+)", text, re.M)
            if m and float(m.group(1)) >= 1:
                attached = True
                break
        except OSError:  # URLError, refused, reset, timed out: try again until the deadline
            pass
        if wp.poll() is not None:
            break
        time.sleep(0.1)
    wlog.seek(0)
    if not check(attached, "tls: the worker attaches with --tls-root-cert (verified HTTPS "
                 "/metrics of the coordinator reads workers_attached >= 1)"):
        print(wlog.read()[-3000:])


def stop_all():
    for p in PROCS:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in PROCS:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


# --------------------------------------------------------------------------------------------
# 7. Dashboard metrics and labels.
# --------------------------------------------------------------------------------------------
def check_dashboard(dashboards, scraped, docs):
    section("dashboard: structure, metric names and labels")
    samples = {}
    for text in scraped:
        s, types = parse_exposition(text)
        for k, v in s.items():
            samples.setdefault(k, set()).update(v)
        for fam, t in types.items():
            samples.setdefault(fam, set())
            if t == "histogram":
                for suffix in ("_bucket", "_sum", "_count"):
                    samples.setdefault(fam + suffix, set()).update({"le"} if suffix == "_bucket"
                                                                   else set())
    print("scraped %d metric names: %s" % (len(samples), ", ".join(sorted(
        n for n in samples if n.startswith("switchyard_")))))
    with open(os.path.join(HERE, "..", "worker", "agent", "worker_metrics.cc")) as f:
        source_names = set(re.findall(r'"(switchyard_worker_[a-z0-9_]+)"', f.read()))
    check(len(source_names) >= 10, "worker_metrics.cc registers %d metric names" %
          len(source_names))
    # Every backend exports every worker metric (a dashboard panel never depends on the GPU).
    for n in sorted(source_names):
        check(n in samples, "%s (registered in worker_metrics.cc) is exported by the CPU worker" % n)
    target_labels = {"job", "instance"}
    prom = docs.get("prometheus/prometheus.yml", [{}])[0]
    for sc in prom.get("scrape_configs", []):
        for r in sc.get("relabel_configs", []):
            if "target_label" in r and not r["target_label"].startswith("__"):
                target_labels.add(r["target_label"])
    for path, d in dashboards.items():
        uid = d.get("uid") or ""
        check(8 <= len(uid) <= 40, "%s: uid %r (8-40 chars)" % (path, uid))
        check(bool(d.get("title")), "%s: title %r" % (path, d.get("title")))
        names = [v["name"] for v in d.get("templating", {}).get("list", [])]
        check("job" in names and "instance" in names, "%s: variables %s" % (path, names))
        ids = [p["id"] for p in d["panels"]]
        check(len(ids) == len(set(ids)), "%s: panel ids unique" % path)
        used, exprs = set(), []
        for p in d["panels"]:
            g = p["gridPos"]
            check(g["x"] + g["w"] <= 24, "%s: panel %r fits the 24-column grid" % (path,
                                                                                   p["title"]))
            if p["type"] == "row":
                continue
            check(bool(p.get("targets")) and p.get("datasource"),
                  "%s: panel %r has a datasource and %d queries" % (path, p["title"],
                                                                     len(p.get("targets", []))))
            for t in p.get("targets", []):
                exprs.append((p["title"], t["expr"], t.get("legendFormat", "")))
        for v in d["templating"]["list"]:
            q = v.get("query")
            if isinstance(q, dict):
                exprs.append(("variable " + v["name"], q.get("query", ""), ""))
        for title, expr, legend in exprs:
            metrics = set(re.findall(r"\b(switchyard_[a-z0-9_]+)", expr))
            check(bool(metrics) or "up{" in expr,
                  "%r queries a Switchyard metric: %s" % (title, sorted(metrics) or expr))
            for m in sorted(metrics):
                used.add(m)
                check(m in samples, "%s (in %r): scraped from the running binaries" % (m, title))
            # Labels: by (...), matchers {l=..}, legend {{l}}.
            allowed = set(target_labels) | {"le", "__name__"}
            for m in metrics:
                allowed |= samples.get(m, set())
            wanted = set()
            for group in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr):
                wanted |= {x.strip() for x in group.split(",") if x.strip()}
            for sel in re.findall(r"\{([^}]*)\}", expr):
                wanted |= set(re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)", sel))
            wanted |= set(re.findall(r"\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}", legend))
            if metrics:
                bad = sorted(wanted - allowed)
                check(not bad, "%r: labels %s exist on the series or are added by "
                      "prometheus.yml%s" % (title, sorted(wanted), (" (missing: %s)" % bad)
                                           if bad else ""))
        for want in ("switchyard_coordinator_jobs", "switchyard_coordinator_workers_attached",
                     "switchyard_coordinator_rpc_duration_seconds_bucket",
                     "switchyard_coordinator_job_restarts_total", "switchyard_worker_step_seconds",
                     "switchyard_worker_tokens_per_second", "switchyard_worker_tflops",
                     "switchyard_worker_mfu", "switchyard_worker_loss",
                     "switchyard_worker_expert_load_imbalance",
                     "switchyard_worker_expert_tokens_min", "switchyard_worker_expert_tokens_max",
                     "switchyard_worker_expert_tokens_mean"):
            check(want in used, "%s: a panel shows %s" % (path, want))
        # Issue 18: a per-layer expert-load heatmap (one row per layer: the series are the
        # layers, Grafana's "heatmap" format) and a queue panel (job states; the per-queue
        # switchyard_queue_* metrics are not exported by main yet, deploy/README.md).
        heat = [t for p in d["panels"] if p["type"] == "heatmap" for t in p["targets"]]
        check(any("switchyard_worker_expert_load_imbalance" in t["expr"] and
                  "by (layer)" in t["expr"] and t.get("format") == "heatmap" and
                  t.get("legendFormat") == "{{layer}}" for t in heat),
              "%s: a heatmap panel of the expert-load imbalance, one row per layer" % path)
        queue = [t for p in d["panels"] if p["title"].startswith("Queue") for t in p["targets"]]
        check(any("PENDING" in t["expr"] and "switchyard_coordinator_jobs" in t["expr"]
                  for t in queue), "%s: a queue panel (pending jobs)" % path)
        check("switchyard_worker_no_such_metric" not in samples and
              "switchyard_worker_no_such_metric" not in source_names,
              "a made-up metric name would not pass")
    return samples


# --------------------------------------------------------------------------------------------
# 8.-9. Prometheus, Grafana provisioning, Dockerfile.
# --------------------------------------------------------------------------------------------
def check_prometheus(docs, by, dashboards):
    section("prometheus.yml against the pods")
    prom = docs["prometheus/prometheus.yml"][0]
    jobs = {sc["job_name"]: sc for sc in prom.get("scrape_configs", [])}
    check(set(jobs) >= {"switchyard-coordinator", "switchyard-worker"},
          "scrape jobs %s" % sorted(jobs))
    pods = [o for o in by.values() if o["kind"] in ("StatefulSet", "Job", "DaemonSet")]
    for name, sc in jobs.items():
        check(any("role" in k and k["role"] == "pod" for k in sc.get("kubernetes_sd_configs", [])),
              "%s: kubernetes_sd role pod" % name)
        selected = []
        for o in pods:
            meta = o["spec"]["template"]["metadata"]
            for c in pod_spec(o)["containers"]:
                for p in c.get("ports", []):
                    lbl = {
                        "__meta_kubernetes_pod_annotation_prometheus_io_scrape":
                            meta.get("annotations", {}).get("prometheus.io/scrape", ""),
                        "__meta_kubernetes_pod_label_app_kubernetes_io_component":
                            meta["labels"].get("app.kubernetes.io/component", ""),
                        "__meta_kubernetes_pod_container_port_name": p.get("name", ""),
                        "__meta_kubernetes_namespace": o["metadata"]["namespace"],
                    }
                    keep = True
                    for r in sc.get("relabel_configs", []):
                        if r.get("action") in ("keep", "drop"):
                            val = ";".join(lbl.get(s, "") for s in r["source_labels"])
                            hit = re.fullmatch(r.get("regex", "(.*)"), val) is not None
                            keep = keep and (hit if r["action"] == "keep" else not hit)
                    if keep:
                        selected.append((o["metadata"]["name"], c, p))
        ports = sorted(p["containerPort"] for _, _, p in selected)
        for o in pods:
            ann = o["spec"]["template"]["metadata"].get("annotations", {})
            if "prometheus.io/port" in ann and any(n == o["metadata"]["name"]
                                                   for n, _, _ in selected):
                check([int(ann["prometheus.io/port"])] == ports,
                      "%s: annotation prometheus.io/port %s = the scraped port %s" %
                      (o["metadata"]["name"], ann["prometheus.io/port"], ports))
        if name == "switchyard-coordinator":
            want = [int(container_args(c).get("http_port", 0)) for o in pods for c in
                    pod_spec(o)["containers"] if "http_port" in container_args(c)]
            check(ports == want, "%s scrapes ports %s = the coordinator's --http-port %s" %
                  (name, ports, want))
        else:
            want = sorted(int(container_args(c).get("metrics_port", 0)) for o in pods for c in
                          pod_spec(o)["containers"] if "metrics_port" in container_args(c))
            check(ports == want and len(ports) > 0,
                  "%s scrapes ports %s = the workers' --metrics-port %s" % (name, ports, want))
    for d in dashboards.values():
        jv = [v for v in d["templating"]["list"] if v["name"] == "job"][0]
        rx = re.search(r'job=~"([^"]+)"', jv["query"]["query"]).group(1)
        check(all(re.fullmatch(rx, j) for j in jobs if j.startswith("switchyard")),
              "dashboard job variable %r matches the scrape jobs" % rx)


# --------------------------------------------------------------------------------------------
# Alert rules (prometheus/alerts.yml) and their promtool unit tests (alerts_test.yml).
# --------------------------------------------------------------------------------------------
ALERTS_PATH = os.path.join(HERE, "prometheus", "alerts.yml")
ALERTS_TEST_PATH = os.path.join(HERE, "prometheus", "alerts_test.yml")
# Metrics alerts.yml uses before any binary exports them: none left (switchyard_job_validation_loss,
# issue 18 item 1, is exported by the workers since the job below evaluates). A scraped metric
# that looks like a validation metric under another name than VALIDATION_METRICS fails the test
# (ALERT_METRIC_LOOKALIKES), so the rule cannot silently watch a name nobody exports.
ALERT_METRICS_NOT_EXPORTED = set()
VALIDATION_METRICS = {"switchyard_job_validation_loss", "switchyard_job_validation_perplexity"}
ALERT_METRIC_LOOKALIKES = re.compile(r"valid|eval|perplexity")


def alert_rules():
    with open(ALERTS_PATH) as f:
        doc = yaml.load(f, Loader=StrictLoader)
    return [r for g in doc.get("groups", []) for r in g.get("rules", []) if "alert" in r]


def alert_selectors(expr):
    """The series selectors of a PromQL expression: metric name plus its {matchers}, if any."""
    out = []
    for m in re.finditer(r"\b(switchyard_[a-z0-9_]+|up)\b(\{[^}]*\})?", expr):
        if m.group(0) not in out:
            out.append(m.group(0))
    return out


def check_alerts(samples, docs):
    """alerts.yml against the scrapes: every metric it names is exported by the running binaries
    (or declared not exported yet), every label it matches, groups by or prints in an annotation
    exists on those series or is added by prometheus.yml; prometheus.yml loads the file."""
    section("alert rules: metric names and labels against the scrapes")
    alerts = alert_rules()
    names = [a["alert"] for a in alerts]
    check(len(names) == len(set(names)) and len(names) >= 7, "alerts.yml: %d alerts %s" % (
        len(names), names))
    prom = docs.get("prometheus/prometheus.yml", [{}])[0]
    check(prom.get("rule_files") == ["alerts.yml"], "prometheus.yml rule_files %s loads "
          "alerts.yml (next to it)" % prom.get("rule_files"))
    target_labels = {"job", "instance"}
    for sc in prom.get("scrape_configs", []):
        for r in sc.get("relabel_configs", []):
            if "target_label" in r and not r["target_label"].startswith("__"):
                target_labels.add(r["target_label"])
    for a in alerts:
        expr = a["expr"]
        metrics = {m for m in re.findall(r"\b(switchyard_[a-z0-9_]+|up)\b", expr)}
        check(bool(metrics), "alert %s queries a metric: %s" % (a["alert"], sorted(metrics)))
        allowed = set(target_labels)
        for m in sorted(metrics):
            if m in ALERT_METRICS_NOT_EXPORTED:
                print("note: alert %s uses %s, not exported yet (deploy/README.md)" % (
                    a["alert"], m))
                continue
            check(m == "up" or m in samples, "alert %s: %s scraped from the running binaries" % (
                a["alert"], m))
            allowed |= samples.get(m, set())
        wanted = set()
        for group in re.findall(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)", expr):
            wanted |= {x.strip() for x in group.split(",") if x.strip()}
        for sel in re.findall(r"\{([^}]*)\}", expr):
            wanted |= set(re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)", sel))
        for text in (a.get("annotations") or {}).values():
            wanted |= set(re.findall(r"\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)", text))
        if not metrics <= ALERT_METRICS_NOT_EXPORTED:
            bad = sorted(wanted - allowed)
            check(not bad, "alert %s: labels %s exist on the series or are added by "
                  "prometheus.yml%s" % (a["alert"], sorted(wanted),
                                        (" (missing: %s)" % bad) if bad else ""))
        check(a.get("labels", {}).get("severity") in ("warning", "critical"),
              "alert %s: severity %s" % (a["alert"], a.get("labels", {}).get("severity")))
    for m in sorted(ALERT_METRICS_NOT_EXPORTED):
        check(m not in samples, "%s is still not exported (else take it out of "
              "ALERT_METRICS_NOT_EXPORTED)" % m)
    lookalikes = sorted(n for n in samples if ALERT_METRIC_LOOKALIKES.search(n)
                        and n not in ALERT_METRICS_NOT_EXPORTED | VALIDATION_METRICS)
    check(VALIDATION_METRICS <= set(samples), "the evaluating job's worker exports %s" %
          sorted(VALIDATION_METRICS))
    check(not lookalikes, "no exported metric looks like a not-yet-exported one under another "
          "name (%s): alerts.yml would watch the wrong name" % (lookalikes or "none"))
    check("switchyard_worker_no_such_metric" not in samples, "a made-up metric would not pass")


def check_promtool_alerts(promtool):
    """promtool check rules alerts.yml; promtool test rules alerts_test.yml; and the unit tests
    cover every alert with a case where it fires and one where it does not."""
    r = subprocess.run([promtool, "check", "rules", ALERTS_PATH], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    check(r.returncode == 0, "promtool check rules alerts.yml: %s" %
          r.stdout.strip().replace("\n", " | "))
    r = subprocess.run([promtool, "test", "rules", ALERTS_TEST_PATH], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    if not check(r.returncode == 0, "promtool test rules alerts_test.yml: exit %d" %
                 r.returncode):
        print(r.stdout[-4000:])
    with open(ALERTS_TEST_PATH) as f:
        t = yaml.load(f, Loader=StrictLoader)
    check(t.get("rule_files") == ["alerts.yml"], "alerts_test.yml tests alerts.yml")
    fires, silent = set(), set()
    for case in t.get("tests", []):
        for at in case.get("alert_rule_test", []):
            (fires if at.get("exp_alerts") else silent).add(at["alertname"])
    for a in alert_rules():
        check(a["alert"] in fires and a["alert"] in silent,
              "alerts_test.yml: %s has a case where it fires (%s) and one where it does not (%s)"
              % (a["alert"], a["alert"] in fires, a["alert"] in silent))


def check_promtool(docs, dashboards):
    """promtool (Debian package prometheus), when installed: the dashboard's PromQL as recording
    rules, and prometheus.yml with its kubernetes_sd_configs swapped for a static target (Debian
    builds Prometheus without Kubernetes discovery) so the relabel rules are checked."""
    section("promtool")
    promtool = shutil.which("promtool")
    if promtool is None:
        print("SKIP: no promtool (Debian package prometheus): PromQL syntax not checked here "
              "(the dashboard queries still run in Prometheus if it is installed)")
        return
    rules = [{"record": "dashboard:q%d" % i, "expr": e} for d in dashboards.values()
             for i, (_, e) in enumerate(dashboard_exprs(d))]
    path = os.path.join(TMP, "dashboard-rules.yml")
    with open(path, "w") as f:
        yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}, f)
    r = subprocess.run([promtool, "check", "rules", path], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    check(r.returncode == 0, "promtool check rules: the dashboard's %d queries parse: %s" %
          (len(rules), r.stdout.strip().replace("\n", " | ")))
    check_promtool_alerts(promtool)
    cfg = copy.deepcopy(docs["prometheus/prometheus.yml"][0])
    # The copy lives elsewhere: its rule_files must name the real files (checked with it).
    cfg["rule_files"] = [os.path.join(HERE, "prometheus", f) for f in cfg.get("rule_files", [])]
    for sc in cfg.get("scrape_configs", []):
        if sc.pop("kubernetes_sd_configs", None) is not None:
            sc["static_configs"] = [{"targets": ["127.0.0.1:1"]}]
    path = os.path.join(TMP, "prometheus-static.yml")
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f)
    r = subprocess.run([promtool, "check", "config", path], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    check(r.returncode == 0, "promtool check config (kubernetes_sd swapped for a static "
          "target): %s" % r.stdout.strip().replace("\n", " | "))


def check_grafana(docs, dashboards):
    section("grafana provisioning")
    ds = docs["grafana/provisioning/datasources/prometheus.yaml"][0]
    pv = docs["grafana/provisioning/dashboards/switchyard.yaml"][0]
    check(ds.get("apiVersion") == 1 and pv.get("apiVersion") == 1, "apiVersion 1 in both")
    uids = {d.get("uid") for d in ds.get("datasources", []) if d.get("type") == "prometheus"}
    for path, d in dashboards.items():
        dv = [v for v in d["templating"]["list"] if v["type"] == "datasource"]
        check(len(dv) == 1 and dv[0]["current"]["value"] in uids,
              "%s: datasource variable defaults to the provisioned uid %s" % (path, uids))
    check(all(p.get("type") == "file" and p.get("options", {}).get("path")
              for p in pv.get("providers", [])), "dashboard provider is type file with a path")


def check_docker(coordinator_bin, worker_bin, by):
    section("Dockerfile")
    with open(os.path.join(HERE, "docker", "Dockerfile")) as f:
        text = f.read()
    joined = re.sub(r"\\\n", " ", text)
    check(re.search(r"^FROM debian:12", text, re.M) is not None, "base image Debian 12")
    user = re.search(r"^USER (\d+)", text, re.M)
    uids = {pod_spec(o)["securityContext"].get("runAsUser") for o in by.values()
            if o["kind"] in ("StatefulSet", "Job", "DaemonSet")}
    check(user is not None and int(user.group(1)) != 0 and uids == {int(user.group(1))},
          "USER %s (non-root) = runAsUser of the pods %s" % (user and user.group(1), uids))
    copied = re.findall(r"bin/(switchyard-[a-z]+)", " ".join(
        l for l in joined.splitlines() if l.startswith("COPY")))
    commands = {os.path.basename(c["command"][0]) for o in by.values()
                if o["kind"] in ("StatefulSet", "Job", "DaemonSet")
                for c in pod_spec(o)["containers"]}
    check(commands <= set(copied), "the image holds the binaries the pods run %s" %
          sorted(commands))
    pk = re.search(r'ARG DEBIAN_PACKAGES="([^"]*)"', joined)
    packages = set(pk.group(1).split()) if pk else set()
    check(len(packages) >= 10, "DEBIAN_PACKAGES lists %d packages" % len(packages))
    cuda = re.search(r'ARG CUDA_PACKAGES="([^"]*)"', joined)
    check(cuda is not None, "CUDA_PACKAGES: %s" % (cuda and cuda.group(1)))
    if subprocess.run(["sh", "-c", "command -v dpkg-query"], stdout=subprocess.DEVNULL).returncode:
        print("SKIP: no dpkg here: the package list is not checked against ldd")
        return
    osr = open("/etc/os-release").read()
    if 'VERSION_ID="12"' not in osr or "debian" not in osr:
        print("SKIP: not Debian 12 here: the package list is not checked against ldd")
        return
    for pkg in sorted(packages):
        r = subprocess.run(["dpkg-query", "-W", "-f=${Status}", pkg], stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, text=True)
        check("install ok installed" in r.stdout, "package %s exists (installed here)" % pkg)
    essential = {"libc6", "libgcc-s1"}  # Essential in every Debian image
    cuda_sonames = {"libcublas.so.13", "libcublasLt.so.13", "libnccl.so.2"}
    for binary in (coordinator_bin, worker_bin):
        out = subprocess.run(["ldd", binary], stdout=subprocess.PIPE, text=True).stdout
        owners, unowned, unresolved, cuda_seen = set(), [], [], set()
        for soname, path in re.findall(r"^\s*(\S+) => (\S+)", out, re.M):
            if soname in cuda_sonames or soname.startswith("libcud"):
                cuda_seen.add(soname)
                continue
            if path == "not":
                unresolved.append(soname)
                continue
            real = os.path.realpath(path)
            r = subprocess.run(["dpkg", "-S", real], stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True)
            if r.returncode != 0:  # /usr-merge: dpkg knows the /lib path
                r = subprocess.run(["dpkg", "-S", re.sub(r"^/usr", "", real)],
                                   stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            pkg = r.stdout.split(":")[0] if r.returncode == 0 else None
            if pkg is None:
                unowned.append(soname)
            else:
                owners.add(pkg)
        check(not unresolved, "%s: every shared library resolves here%s" % (
            os.path.basename(binary), (" (not: %s)" % unresolved) if unresolved else ""))
        missing = sorted(owners - packages - essential)
        check(not missing and not unowned,
              "%s: the %d packages owning its shared libraries are in DEBIAN_PACKAGES%s" % (
                  os.path.basename(binary), len(owners),
                  (" (missing: %s, unowned: %s)" % (missing, unowned)) if missing or unowned
                  else ""))
        check(cuda_seen <= cuda_sonames, "%s: CUDA libraries %s are cuBLAS 13 / NCCL 2 "
              "(CUDA_PACKAGES)" % (os.path.basename(binary), sorted(cuda_seen)))


def run_checks(coordinator_bin, worker_bin, syctl_bin):
    docs, dashboards = load_all()
    by, tls_by = manifests(docs)
    gen, gen_tls = generated_workers(syctl_bin)
    check_no_root_mounts(docs, gen)
    by.update(gen)
    tls_by.update(gen_tls)
    coord, workers, _ = check_manifests(with_token_secret(by, docs))
    check_flags(by, tls_by, coordinator_bin, worker_bin)
    DASHBOARDS.update(dashboards)
    check_promtool(docs, dashboards)
    scraped = []
    try:
        r = run_binaries(coord, workers, coordinator_bin, worker_bin, syctl_bin)
        if r is not None:
            scraped = r
    finally:
        stop_all()
    PROCS.clear()
    try:
        run_tls(tls_by, coordinator_bin, worker_bin)
    finally:
        stop_all()
    check(len(scraped) == 2, "scraped the coordinator's and the worker's /metrics")
    check(len(LIVE_WORKER_JOBS) == 1, "syctl rendered the worker Job of a job on the real "
          "coordinator")
    sets = [("base", by), ("tls", tls_by), ("live syctl", LIVE_WORKER_JOBS),
            ("token template", with_token_secret({}, docs))]
    check_schemas(sets)
    check_security(sets[:3])
    samples = check_dashboard(dashboards, scraped, docs)
    check_alerts(samples, docs)
    check_prometheus(docs, by, dashboards)
    check_grafana(docs, dashboards)
    check_docker(coordinator_bin, worker_bin, by)


def main():
    if len(sys.argv) != 4:
        print("usage: deploy_test.py SWITCHYARD_COORDINATOR SWITCHYARD_WORKER SYCTL",
              file=sys.stderr)
        return 2
    coordinator_bin, worker_bin, syctl_bin = (os.path.abspath(a) for a in sys.argv[1:4])
    log_path = os.path.join(os.environ.get("TEST_UNDECLARED_OUTPUTS_DIR") or TMP,
                            "deploy_test.log")
    sys.stdout = _Log(log_path)
    print("every check, passing ones included: %s" % log_path)
    try:
        run_checks(coordinator_bin, worker_bin, syctl_bin)
    except Exception as e:  # a malformed file can break a later step: report it as a failure
        traceback.print_exc(file=sys.stdout)
        check(False, "the test stopped early: %s: %s" % (type(e).__name__, e))
    print("\n%d checks, %d failed" % (CHECKS[0], len(FAILURES)))
    for f in FAILURES:
        print("FAILED: " + f)
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
