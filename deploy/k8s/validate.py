#!/usr/bin/env python3
"""Checks the Kubernetes manifests of deploy/k8s without a cluster: every file of
kustomization.yaml parses; every object has the fields its kind requires (apps/v1
StatefulSet and Deployment, batch/v1 Job, v1 Service, ConfigMap, PersistentVolumeClaim,
Namespace) with the right types; selectors match pod labels; Services select pods that
exist and target ports they expose; probes hit declared ports; every container has an
image and resource requests and runs as non-root; volume mounts name volumes or claim
templates; the shard count agrees between the StatefulSet, --num_shards and the
coordinator's --shards; tables.json parses and names each table with a dim; the training
Job's tessera-train names a --model, resumes with --resume=auto (so a restarted pod goes
on, and the tables the init container applied are taken, not refused) and every table of
tables.json belongs to that model (MODEL.*); a training Job of --num_workers=N > 1 is an
Indexed Job of N completions run N at a time, each pod passing its completion index as
--worker_index (through JOB_COMPLETION_INDEX or the job-completion-index annotation) and
checkpointing (--checkpoint_every), so its workers can resume together; serving replicas
(tessera-serve) serve the Job's model, which the Job publishes (--publish_dense_every),
and are probed for readiness over gRPC (SERVING: caught up) but for liveness only by their
port (a replica catching up is alive).

    /usr/bin/python3 deploy/k8s/validate.py [deploy/k8s]      # exit 1 and a list of problems
"""
import json
import os
import re
import sys

import yaml

KINDS = {
    "Namespace": "v1", "ConfigMap": "v1", "Service": "v1", "PersistentVolumeClaim": "v1",
    "StatefulSet": "apps/v1", "Deployment": "apps/v1", "Job": "batch/v1",
}


class Problems(list):
    def need(self, ok, where, what):
        if not ok:
            self.append(f"{where}: {what}")
        return ok


def typed(problems, obj, path, kind_of, where):
    """obj[path...] exists and is a kind_of; returns it or None."""
    cur = obj
    for key in path:
        if not isinstance(cur, dict) or key not in cur:
            problems.append(f"{where}: missing {'.'.join(path)}")
            return None
        cur = cur[key]
    if not isinstance(cur, kind_of):
        problems.append(f"{where}: {'.'.join(path)} must be {kind_of.__name__}, got {type(cur).__name__}")
        return None
    return cur


def check_pod(problems, pod_spec, where, claim_templates=()):
    volumes = {v.get("name") for v in pod_spec.get("volumes", [])} | set(claim_templates)
    security = pod_spec.get("securityContext", {})
    problems.need(security.get("runAsNonRoot") is True, where, "securityContext.runAsNonRoot must be true")
    containers = typed(problems, pod_spec, ["containers"], list, where) or []
    ports = set()
    for c in containers + pod_spec.get("initContainers", []):
        cw = f"{where} container {c.get('name')}"
        problems.need(isinstance(c.get("name"), str), cw, "needs a name")
        problems.need(isinstance(c.get("image"), str) and c["image"], cw, "needs an image")
        requests = c.get("resources", {}).get("requests", {})
        problems.need("cpu" in requests and "memory" in requests, cw, "needs cpu and memory requests")
        for p in c.get("ports", []):
            problems.need(isinstance(p.get("containerPort"), int), cw, "containerPort must be int")
            ports.add(p.get("containerPort"))
        for m in c.get("volumeMounts", []):
            problems.need(m.get("name") in volumes, cw, f"mounts unknown volume {m.get('name')!r}")
    for c in containers:
        cw = f"{where} container {c.get('name')}"
        for probe in ("readinessProbe", "livenessProbe"):
            if probe in c:
                port = c[probe].get("grpc", c[probe].get("tcpSocket", {})).get("port")
                problems.need(port in ports, cw, f"{probe} port {port} is not a container port")
    return ports, containers


def check_workers(problems, job_spec, container, args, where):
    """A data-parallel training Job: N indexed pods, each worker its completion index."""
    workers = [a.split("=", 1)[1] for a in args if a.startswith("--num_workers=")]
    n = int(workers[-1]) if workers and workers[-1].isdigit() else 1
    if n <= 1:
        return
    problems.need(job_spec.get("completionMode") == "Indexed", where,
                  f"--num_workers={n} needs completionMode: Indexed (one pod per worker index)")
    problems.need(job_spec.get("completions") == n and job_spec.get("parallelism") == n, where,
                  f"--num_workers={n} needs completions and parallelism of {n} (every worker at once)")
    index = [a.split("=", 1)[1] for a in args if a.startswith("--worker_index=")]
    env = {e.get("name"): e for e in container.get("env", [])}
    from_index = False
    if index:
        m = re.fullmatch(r"\$\((\w+)\)", index[0])
        if m and m.group(1) == "JOB_COMPLETION_INDEX":
            from_index = True
        elif m and m.group(1) in env:
            path = env[m.group(1)].get("valueFrom", {}).get("fieldRef", {}).get("fieldPath", "")
            from_index = "job-completion-index" in path
    problems.need(from_index, where,
                  "--worker_index must be the pod's completion index ($(JOB_COMPLETION_INDEX) or an "
                  "env var from the batch.kubernetes.io/job-completion-index annotation)")
    problems.need(any(a.startswith("--checkpoint_every=") for a in args), where,
                  f"--num_workers={n} needs --checkpoint_every: a restarted worker resumes with the "
                  "others from the newest checkpoint")


class Seen:
    """What the objects say that other objects must agree with."""

    def __init__(self):
        self.pods = []  # (labels, ports, where)
        self.services = []  # (object, where)
        self.shard_replicas, self.statefulset, self.num_shards_args = None, None, set()
        self.coordinator_shards, self.train_model, self.table_names = None, None, None
        self.serve_models, self.train_publishes = [], False


def load_objects(problems, folder):
    """(file name, object) of every resource kustomization.yaml lists."""
    kustomization = yaml.safe_load(open(os.path.join(folder, "kustomization.yaml")))
    problems.need(kustomization.get("kind") == "Kustomization", "kustomization.yaml", "kind must be Kustomization")
    objects = []
    for name in kustomization.get("resources", []):
        path = os.path.join(folder, name)
        if not problems.need(os.path.exists(path), "kustomization.yaml", f"resource {name} missing"):
            continue
        for doc in yaml.safe_load_all(open(path)):
            if doc is not None:
                objects.append((name, doc))
    return objects


def check_train_job(problems, obj, containers, where, seen):
    for c in containers:
        args = c.get("args", []) + c.get("command", [])
        if "tessera-train" not in args:
            continue
        cw = f"{where} container {c.get('name')}"
        problems.need("--resume=auto" in args, cw,
                      "tessera-train must pass --resume=auto (tables exist after the "
                      "init container; a restarted pod must continue)")
        models = [a.split("=", 1)[1] for a in args if a.startswith("--model=")]
        if problems.need(len(models) == 1, cw, "tessera-train needs one --model"):
            seen.train_model = models[0]
        seen.train_publishes = any(a.startswith("--publish_dense_every=") and a != "--publish_dense_every=0"
                                   for a in args)
        check_workers(problems, obj["spec"], c, args, cw)


def check_workload(problems, obj, kind, where, seen):
    """A StatefulSet, Deployment or Job: its selector, pods, and the flags of its servers."""
    template = typed(problems, obj, ["spec", "template"], dict, where) or {}
    labels = template.get("metadata", {}).get("labels", {})
    if kind != "Job":
        match = typed(problems, obj, ["spec", "selector", "matchLabels"], dict, where) or {}
        problems.need(match and all(labels.get(k) == v for k, v in match.items()), where,
                      "selector.matchLabels must match the pod template's labels")
        typed(problems, obj, ["spec", "replicas"], int, where)
    else:
        problems.need(template.get("spec", {}).get("restartPolicy") in ("Never", "OnFailure"),
                      where, "a Job's restartPolicy must be Never or OnFailure")
    claims = [t.get("metadata", {}).get("name") for t in obj["spec"].get("volumeClaimTemplates", [])]
    pod_spec = typed(problems, template, ["spec"], dict, where) or {}
    ports, containers = check_pod(problems, pod_spec, where, claims)
    seen.pods.append((labels, ports, where))
    text = json.dumps(containers)
    if kind == "Job":
        check_train_job(problems, obj, containers, where, seen)
    if kind == "StatefulSet":
        problems.need(isinstance(obj["spec"].get("serviceName"), str), where, "needs serviceName")
        seen.shard_replicas = obj["spec"].get("replicas")
        seen.num_shards_args |= {int(n) for n in re.findall(r"--num_shards=(\d+)", text)}
        seen.statefulset = obj
    if "tessera-serve" in text:
        check_serving(problems, containers, where, seen)
    m = re.search(r"--shards=([^\"\s]+)", text)
    if m:
        seen.coordinator_shards = m.group(1).split(",")


def check_serving(problems, containers, where, seen):
    """A tessera-serve container: its model, and probes that tell catching up from dead."""
    for c in containers:
        if "tessera-serve" not in json.dumps(c.get("args", [])):
            continue
        m = re.search(r"--model=([A-Za-z0-9_-]+)", json.dumps(c["args"]))
        if problems.need(m, where, "tessera-serve needs a --model"):
            seen.serve_models.append((m.group(1), where))
        problems.need("grpc" in c.get("readinessProbe", {}), where,
                      "a replica's readinessProbe must be grpc (SERVING once caught up)")
        problems.need("grpc" not in c.get("livenessProbe", {}), where,
                      "a replica's livenessProbe must not be grpc: NOT_SERVING while it "
                      "catches up would restart it")


def check_tables_json(problems, obj, where, seen):
    try:
        tables = json.loads(obj["data"]["tables.json"])["tables"]
        for t in tables:
            problems.need(isinstance(t.get("name"), str) and t["name"], where, "a table without a name")
            problems.need(isinstance(t.get("dim"), int) and t["dim"] > 0, where,
                          f"table {t.get('name')!r} needs a dim > 0")
        names = [t.get("name") for t in tables]
        problems.need(len(names) == len(set(names)), where, "table names repeat")
        seen.table_names = names
    except (ValueError, KeyError, TypeError) as e:
        problems.append(f"{where}: tables.json does not parse: {e}")


def check_object(problems, name, obj, seen):
    kind = obj.get("kind")
    where = f"{name} {kind}/{obj.get('metadata', {}).get('name')}"
    if not problems.need(kind in KINDS, where, f"unknown kind {kind!r}"):
        return
    problems.need(obj.get("apiVersion") == KINDS[kind], where, f"apiVersion must be {KINDS[kind]}")
    typed(problems, obj, ["metadata", "name"], str, where)
    if kind in ("StatefulSet", "Deployment", "Job"):
        check_workload(problems, obj, kind, where, seen)
    if kind == "Service":
        seen.services.append((obj, where))
    if kind == "PersistentVolumeClaim":
        typed(problems, obj, ["spec", "resources", "requests", "storage"], str, where)
    if kind == "ConfigMap" and "tables.json" in obj.get("data", {}):
        check_tables_json(problems, obj, where, seen)


def check_agreement(problems, seen):
    """The tables are the Job's model's; services select pods with their ports; the
    coordinator's --shards and the shards' --num_shards match the StatefulSet."""
    if seen.train_model is not None and seen.table_names is not None:
        model = seen.train_model
        strays = [n for n in seen.table_names if not str(n).startswith(model + ".")]
        problems.need(not strays, "tables.json",
                      f"tables {strays[:3]} are not of the Job's model '{model}' ({model}.*)")
    for svc, where in seen.services:
        selector = svc.get("spec", {}).get("selector", {})
        targets = [p for p in seen.pods if selector and all(p[0].get(k) == v for k, v in selector.items())]
        if problems.need(targets, where, f"selects no pods ({selector})"):
            for port in svc["spec"].get("ports", []):
                target = port.get("targetPort", port.get("port"))
                problems.need(any(target in p[1] for p in targets), where,
                              f"targetPort {target} is not a port of the pods it selects")
    for model, where in seen.serve_models:
        if seen.train_model is not None:
            problems.need(model == seen.train_model, where,
                          f"serves model '{model}', the Job trains '{seen.train_model}'")
            problems.need(seen.train_publishes, where, "the Job publishes no dense network "
                          "for replicas (tessera-train --publish_dense_every)")
    replicas, shards = seen.shard_replicas, seen.coordinator_shards
    if replicas is None:
        return
    problems.need(seen.num_shards_args == {replicas}, "shards",
                  f"--num_shards {sorted(seen.num_shards_args)} differs from replicas {replicas}")
    if problems.need(shards is not None, "coordinator", "no --shards list"):
        problems.need(len(shards) == replicas, "coordinator",
                      f"--shards names {len(shards)} shards, the StatefulSet has {replicas}")
        name, service = seen.statefulset["metadata"]["name"], seen.statefulset["spec"].get("serviceName")
        for i, address in enumerate(shards):
            problems.need(address.split(":")[0] == f"{name}-{i}.{service}", "coordinator",
                          f"shard {i} should be {name}-{i}.{service}, got {address}")


def main(folder: str) -> int:
    problems = Problems()
    objects = load_objects(problems, folder)
    seen = Seen()
    for name, obj in objects:
        check_object(problems, name, obj, seen)
    check_agreement(problems, seen)
    for p in problems:
        print("invalid:", p)
    if not problems:
        print(f"k8s manifests: {len(objects)} objects ok")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))))
