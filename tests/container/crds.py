"""Checks of the objects kubernetes-validate has no schema for (custom
resources: cert-manager's and the Prometheus Operator's), in the rendered
overlays given as files: the fields their CRDs require and the values they
accept, and that the objects agree with the rest of the rendering (an
issuer that exists, a secret that a Certificate writes, a Service port that
exists, a TLS path under a mounted secret). Exit 1 with every problem.

    crds.py RENDERING.yaml...
"""

from __future__ import annotations

import re
import sys

import yaml

USAGES = {"signing", "digital signature", "content commitment", "key encipherment", "key agreement",
          "data encipherment", "cert sign", "crl sign", "encipher only", "decipher only", "any",
          "server auth", "client auth", "code signing", "email protection", "s/mime", "ipsec end system",
          "ipsec tunnel", "ipsec user", "timestamping", "ocsp signing", "microsoft sgc", "netscape sgc"}
KNOWN = {("cert-manager.io/v1", "Certificate"), ("cert-manager.io/v1", "Issuer"),
         ("cert-manager.io/v1", "ClusterIssuer"), ("monitoring.coreos.com/v1", "ServiceMonitor"),
         ("monitoring.coreos.com/v1", "PrometheusRule")}


def hours(d: str) -> float:
    m = re.fullmatch(r"(\d+)h", d)
    if not m:
        raise ValueError(f"duration {d!r}: expected hours (NNNh)")
    return float(m.group(1))


def check(path: str, docs: list[dict]) -> list[str]:
    bad: list[str] = []
    where = lambda d: f"{path}: {d['kind']} {d['metadata'].get('namespace', '')}/{d['metadata']['name']}"
    issuers = {(d["kind"], d["metadata"]["name"]) for d in docs
               if d.get("apiVersion") == "cert-manager.io/v1" and d["kind"] in ("Issuer", "ClusterIssuer")}
    cert_secrets = {}
    for d in docs:
        api, kind = d.get("apiVersion", ""), d.get("kind")
        group = api.split("/")[0] if "/" in api else ""
        if "." in group and not group.endswith(".k8s.io") and (api, kind) not in KNOWN:
            bad.append(f"{path}: {api} {kind}: a custom resource this check does not know")
        spec = d.get("spec") or {}
        if (api, kind) == ("cert-manager.io/v1", "Certificate"):
            w = where(d)
            if not d["metadata"].get("namespace"):
                bad.append(f"{w}: no namespace")
            if not spec.get("secretName"):
                bad.append(f"{w}: spec.secretName is required")
            ref = spec.get("issuerRef") or {}
            if not ref.get("name"):
                bad.append(f"{w}: spec.issuerRef.name is required")
            elif (ref.get("kind", "Issuer"), ref["name"]) not in issuers:
                bad.append(f"{w}: issuer {ref.get('kind', 'Issuer')}/{ref['name']} is not in the rendering")
            if ref.get("group", "cert-manager.io") != "cert-manager.io":
                bad.append(f"{w}: issuerRef.group {ref['group']}")
            if not (spec.get("commonName") or spec.get("dnsNames") or spec.get("ipAddresses") or spec.get("uris")):
                bad.append(f"{w}: no subject (commonName, dnsNames, ipAddresses or uris)")
            for u in spec.get("usages", []):
                if u not in USAGES:
                    bad.append(f"{w}: usage {u!r} is not one of cert-manager's")
            pk = spec.get("privateKey") or {}
            if pk.get("algorithm") not in (None, "RSA", "ECDSA", "Ed25519"):
                bad.append(f"{w}: privateKey.algorithm {pk['algorithm']}")
            if pk.get("algorithm") == "ECDSA" and pk.get("size") not in (None, 256, 384, 521):
                bad.append(f"{w}: ECDSA size {pk['size']}")
            if pk.get("rotationPolicy") not in (None, "Never", "Always"):
                bad.append(f"{w}: rotationPolicy {pk['rotationPolicy']}")
            try:
                if "duration" in spec and "renewBefore" in spec and hours(spec["renewBefore"]) >= hours(spec["duration"]):
                    bad.append(f"{w}: renewBefore is not shorter than duration")
                if "duration" in spec and hours(spec["duration"]) < 1:
                    bad.append(f"{w}: duration under cert-manager's minimum of 1h")
            except ValueError as e:
                bad.append(f"{w}: {e}")
            cert_secrets[(d["metadata"].get("namespace"), spec.get("secretName"))] = d
        elif api == "cert-manager.io/v1" and kind in ("Issuer", "ClusterIssuer"):
            w = where(d)
            kinds = [k for k in ("selfSigned", "ca", "acme", "vault", "venafi") if k in spec]
            if len(kinds) != 1:
                bad.append(f"{w}: exactly one issuer type expected, found {kinds}")
            if "ca" in spec and not (spec["ca"] or {}).get("secretName"):
                bad.append(f"{w}: spec.ca.secretName is required")
        elif (api, kind) == ("monitoring.coreos.com/v1", "ServiceMonitor"):
            w = where(d)
            sel = (spec.get("selector") or {}).get("matchLabels")
            if not sel:
                bad.append(f"{w}: spec.selector.matchLabels is required here")
            eps = spec.get("endpoints") or []
            if not eps:
                bad.append(f"{w}: no endpoints")
            services = [s for s in docs if s.get("kind") == "Service"
                        and s["metadata"].get("namespace") in (spec.get("namespaceSelector") or {}).get("matchNames", [s["metadata"].get("namespace")])
                        and all(s["metadata"].get("labels", {}).get(k) == v for k, v in (sel or {}).items())]
            if not services:
                bad.append(f"{w}: selects no Service of the rendering")
            for s in services:
                names = {p.get("name") for p in s["spec"].get("ports", [])}
                for e in eps:
                    if e.get("port") not in names:
                        bad.append(f"{w}: port {e.get('port')!r} is not a port of Service {s['metadata']['name']}")
                if spec.get("jobLabel") and spec["jobLabel"] not in s["metadata"].get("labels", {}):
                    bad.append(f"{w}: Service {s['metadata']['name']} has no label {spec['jobLabel']} (the job's name)")
                elif spec.get("jobLabel") and s["metadata"]["labels"][spec["jobLabel"]] != "hf3fs-meta":
                    bad.append(f"{w}: the job is not named hf3fs-meta, which the alert rules select")
        elif (api, kind) == ("monitoring.coreos.com/v1", "PrometheusRule"):
            w = where(d)
            groups = spec.get("groups") or []
            if not groups:
                bad.append(f"{w}: no groups")
            for g in groups:
                if not g.get("name") or not g.get("rules"):
                    bad.append(f"{w}: a group without name or rules")
                for r in g.get("rules", []):
                    if ("alert" in r) == ("record" in r) or not r.get("expr"):
                        bad.append(f"{w}: group {g.get('name')}: a rule needs alert or record, and expr")

    # Secrets mounted by the pods: a Certificate writes each (or, for the
    # cluster token, the operator makes it, docs/kubernetes.md), and every
    # TLS file an environment variable names lies under a mounted secret.
    if cert_secrets:
        for d in docs:
            tmpl = ((d.get("spec") or {}).get("template") or {}).get("spec")
            if not tmpl:
                continue
            ns = d["metadata"].get("namespace")
            vols = {v["name"]: v["secret"]["secretName"] for v in tmpl.get("volumes", []) if "secret" in v}
            for c in tmpl.get("containers", []) + tmpl.get("initContainers", []):
                mounts = {m["mountPath"]: vols.get(m["name"]) for m in c.get("volumeMounts", [])}
                for e in c.get("env", []):
                    if re.search(r"_(CA|CERT|KEY)$", e["name"]) and e.get("value", "").startswith("/"):
                        under = [s for mp, s in mounts.items() if e["value"].startswith(mp.rstrip("/") + "/")]
                        if not under or under[0] is None:
                            bad.append(f"{path}: {d['kind']} {d['metadata']['name']}: {e['name']}={e['value']} is under no mounted secret")
                        elif (ns, under[0]) not in cert_secrets:
                            bad.append(f"{path}: {d['kind']} {d['metadata']['name']}: {e['name']} is in secret {under[0]}, which no Certificate in {ns} writes")
    return bad


def main() -> None:
    bad = []
    for path in sys.argv[1:]:
        bad += check(path, [d for d in yaml.safe_load_all(open(path)) if d])
    if bad:
        sys.exit("\n".join(bad))
    print(f"custom resources of {len(sys.argv) - 1} renderings: required fields and references check out")


if __name__ == "__main__":
    main()
