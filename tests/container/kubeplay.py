"""A rendering of an overlay that `podman kube play` (4.3) can run, made
from `kubectl kustomize` output, not written by hand: each StatefulSet of
one replica becomes a Deployment of one (kube play ignores StatefulSets),
its volumeClaimTemplates PersistentVolumeClaims that kube play makes into
named volumes, and the named port gets a host port on 127.0.0.1. The liveness probe is left out: kube play
would make it a shell command, and the image has no shell; the image's
health check runs instead. Every
other field of the pod (the command, the environment, the probes, the
security context, the mounts) is the rendering's. Kinds kube play ignores
(Service, NetworkPolicy, DaemonSet, Namespace, ...) are left out.

    kubectl kustomize contrib/kubernetes/overlays/single |
        python3 kubeplay.py --image IMAGE --suffix SUFFIX --port-map http=28000

SUFFIX is appended to every name, so that a run never meets another's
objects. Prints the rendering (YAML) on stdout.
"""

from __future__ import annotations

import argparse
import copy
import sys

import yaml


def convert(docs: list[dict], image_of: dict[str, str], suffix: str, ports: dict[str, int]) -> list[dict]:
    out = []
    for d in docs:
        if d.get("kind") != "StatefulSet":
            continue
        name = d["metadata"]["name"]
        spec = d["spec"]
        if spec.get("replicas", 1) != 1:
            sys.exit(f"kubeplay.py: StatefulSet {name} has {spec['replicas']} replicas; only 1 converts to a Deployment")
        tmpl = copy.deepcopy(spec["template"])
        pod = tmpl["spec"]
        for claim in spec.get("volumeClaimTemplates", []):
            cname = f"{claim['metadata']['name']}-{name}-0-{suffix}"
            out.append({
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": cname},
                "spec": claim["spec"],
            })
            pod.setdefault("volumes", []).append(
                {"name": claim["metadata"]["name"], "persistentVolumeClaim": {"claimName": cname}})
        for c in pod.get("containers", []):
            if c["image"] in image_of:
                c["image"] = image_of[c["image"]]
            # kube play 4.3 makes a liveness probe the container's health
            # check as a shell command (`CMD-SHELL ... || exit 1`), which an
            # image without a shell cannot run: the image's own HEALTHCHECK
            # (`hf3fs-meta ctl health`) stays instead.
            c.pop("livenessProbe", None)
            for p in c.get("ports", []):
                if p.get("name") in ports:
                    p["hostPort"] = ports[p["name"]]
                    p["hostIP"] = "127.0.0.1"
        out.append({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": f"{name}-{suffix}", "labels": d["metadata"].get("labels", {})},
            "spec": {"replicas": 1, "selector": spec["selector"], "template": tmpl},
        })
    if not any(o["kind"] == "Deployment" for o in out):
        sys.exit("kubeplay.py: no StatefulSet in the rendering")
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--image", action="append", default=[], metavar="FROM=TO",
                    help="replace the image FROM of the rendering with TO")
    ap.add_argument("--suffix", required=True)
    ap.add_argument("--port-map", action="append", default=[], metavar="NAME=HOSTPORT")
    a = ap.parse_args()
    images = dict(i.split("=", 1) for i in a.image)
    ports = {k: int(v) for k, v in (p.split("=", 1) for p in a.port_map)}
    docs = [d for d in yaml.safe_load_all(sys.stdin) if d]
    yaml.safe_dump_all(convert(docs, images, a.suffix, ports), sys.stdout, sort_keys=False)


if __name__ == "__main__":
    main()
