#!/usr/bin/env bash
# The container image and the Kubernetes manifests, tested by running them
# (docs/kubernetes.md, "What CI runs"):
#
#   tests/container/run.sh [BINARY]     (default target/ci/hf3fs-meta)
#
# 1. every overlay of contrib/kubernetes renders (kubectl kustomize), every
#    object validates against Kubernetes 1.37.0's OpenAPI schemas
#    (kubernetes-validate --strict; a missing schema fails, except for the
#    custom resources, which crds.py checks), and the monitoring copies
#    equal their sources (generate.sh --check);
# 2. the image builds from BINARY (contrib/container/build.sh), its labels,
#    user and version are right;
# 3. the single overlay runs in podman kube play (a Deployment form of its
#    rendering, kubeplay.py), vLLM's and SGLang's own clients save and load
#    through the node-forward DaemonSet's socat command line, the pod is
#    played again on the same volume and every key is still there, and
#    verify and inspect read that volume;
# 4. the HA shape: etcd on loopback, two server containers with the ha
#    overlay's environment (--ha etcd), the relay container with the relay
#    DaemonSet's; the clients through the relay; the image's health check;
#    the preStop hook's switchover on the follower (nothing to do) and on
#    the leader (leadership moves); the leader killed; the clients through
#    the relay again find everything and keep saving.
#
# Loopback only (127.0.0.1 port maps, or the host network with every
# listener on 127.0.0.1). Every container, pod, volume and image made here
# is removed on exit, failed or not. Installs podman, buildah, runc,
# catatonit, socat, etcd and openssl from Debian when missing (as root), and
# kubernetes-validate into .venv-container. The engine clients need the
# .venv of tests/python (.ci/run makes it).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
ROOT="$PWD"
BIN="${1:-target/ci/hf3fs-meta}"
PY="${HF3FS_META_PYTHON:-$ROOT/.venv/bin/python}"
RUN="hf3fsci$$"
IMAGE="localhost/$RUN"
TMP="$(mktemp -d)"
ETCD_PID=""
KUBE_FILE=""
PAUSE_BEFORE=yes

say() { printf '\n--- %s (%ss)\n' "$*" "$SECONDS"; }
fail() { echo "FAILED: $*" >&2; exit 1; }

cleanup() {
    set +e
    [ -n "$KUBE_FILE" ] && podman kube down "$KUBE_FILE" >/dev/null 2>&1
    for c in $(podman ps -aq --filter "label=hf3fs-meta-ci=$RUN" 2>/dev/null); do
        podman rm -f -v -t 0 "$c" >/dev/null 2>&1
    done
    podman pod rm -f "hf3fs-meta-$RUN-pod-0" >/dev/null 2>&1
    for v in $(podman volume ls -q 2>/dev/null | grep -- "$RUN"); do podman volume rm -f "$v" >/dev/null 2>&1; done
    podman rmi -f "$IMAGE:latest" "$IMAGE:$(awk '{print $2}' <<<"$("$BIN" --version)")" >/dev/null 2>&1
    [ -n "$ETCD_PID" ] && kill "$ETCD_PID" 2>/dev/null && wait "$ETCD_PID" 2>/dev/null
    # kube play builds a local pause image for its pods' infra containers.
    [ "$PAUSE_BEFORE" = no ] && podman rmi -f "$(podman images -q localhost/podman-pause 2>/dev/null)" >/dev/null 2>&1
    rm -rf "$TMP"
    left="$(podman ps -aq --filter "label=hf3fs-meta-ci=$RUN" 2>/dev/null; podman volume ls -q 2>/dev/null | grep -- "$RUN")"
    [ -z "$left" ] || echo "cleanup left: $left" >&2
}
trap 'set +e; cleanup' EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

[ -x "$BIN" ] || fail "$BIN: build it first (cargo build --profile ci --bin hf3fs-meta)"
[ -x "$PY" ] || fail "$PY: the tests/python venv is missing (python3 -m venv .venv && .venv/bin/pip install -r tests/python/requirements.txt)"

say "tools: podman, buildah, runc, catatonit, socat, etcd, openssl; kubernetes-validate in .venv-container"
need=()
for t in podman:podman buildah:buildah runc:runc catatonit:catatonit socat:socat etcd:etcd-server openssl:openssl; do
    command -v "${t%%:*}" >/dev/null || need+=("${t#*:}")
done
if [ ${#need[@]} -gt 0 ]; then
    [ "$(id -u)" -eq 0 ] || fail "missing ${need[*]} (apt-get install them)"
    apt-get update -qq && apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
command -v kubectl >/dev/null || fail "kubectl (1.27 or later, with kustomize v5) is not installed"
{ [ -x .venv-container/bin/python ] || python3 -m venv .venv-container; } &&
    .venv-container/bin/pip install -q -r tests/container/requirements.txt
# Two settings this sandbox needs (crun fails on its cgroups; its hard
# limits are below podman's default ulimits), harmless elsewhere.
export CONTAINERS_CONF="$TMP/containers.conf"
printf '[containers]\ndefault_ulimits = ["nofile=20000:20000", "nproc=4096:4096"]\n[engine]\nruntime = "runc"\n' >"$CONTAINERS_CONF"
podman() { command podman "$@" 2> >(grep -v 'unable to get systemd connection' >&2); }
PAUSE_BEFORE="$(podman images -q localhost/podman-pause | grep -q . && echo yes || echo no)"
freeport() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
# $1 url: waits (bounded) until GET /health answers 200.
wait_health() {
    for _ in $(seq 1 300); do
        curl -sf -m 2 -o /dev/null "$1/health" && return 0
        sleep 0.1
    done
    return 1
}

# engines URL STATE: the engines' clients (engines.py), bounded: neither
# client sets a request timeout, so a hang would otherwise last forever.
engines() { timeout 120 "$PY" tests/container/engines.py "$@" || fail "the engines' clients at $1 (exit $?)"; }

# --- 1. Render and validate -------------------------------------------------------
say "render every overlay; validate against Kubernetes 1.37.0 (strict); the custom resources"
contrib/kubernetes/generate.sh --check
renders=()
for o in contrib/kubernetes/overlays/*/; do
    name="$(basename "$o")"
    kubectl kustomize "$o" >"$TMP/render-$name.yaml" || fail "kubectl kustomize $o"
    renders+=("$TMP/render-$name.yaml")
    out="$(.venv-container/bin/kubernetes-validate -k 1.37.0 --strict "$TMP/render-$name.yaml" 2>&1)" ||
        { echo "$out"; fail "kubernetes-validate $o"; }
    # A missing schema is a warning with exit 0: only the custom resources
    # crds.py checks may lack one.
    unexpected="$(grep -v '^INFO .* passed for resource' <<<"$out" |
        grep -Ev "^WARN .* Couldn't find schema for kind (Certificate|Issuer|ClusterIssuer) with api version cert-manager.io/v1 |^WARN .* Couldn't find schema for kind (ServiceMonitor|PrometheusRule) with api version monitoring.coreos.com/v1 " || true)"
    [ -z "$unexpected" ] || { echo "$unexpected"; fail "kubernetes-validate $o: not every object passed"; }
    echo "$name: $(grep -c '^INFO .* passed' <<<"$out") objects valid, $(grep -c '^WARN' <<<"$out" || true) custom resources left to crds.py"
done
.venv-container/bin/python tests/container/crds.py "${renders[@]}"

# --- 2. The image -------------------------------------------------------------------
say "build the image from $BIN"
VERSION="$("$BIN" --version | awk '{print $2}')"
ref="$(contrib/container/build.sh --binary "$BIN" --image "$IMAGE" 2>"$TMP/build.log" | tail -1)" ||
    { cat "$TMP/build.log"; fail "contrib/container/build.sh"; }
[ "$ref" = "$IMAGE:$VERSION" ] || fail "build.sh tagged $ref, expected $IMAGE:$VERSION"
got="$(podman run --rm "$IMAGE:latest" --version | awk '{print $2}')"
[ "$got" = "$VERSION" ] || fail "the image's binary says $got, the tag $VERSION"
labels="$(podman image inspect "$IMAGE:$VERSION" --format '{{index .Labels "org.opencontainers.image.version"}} {{index .Labels "org.opencontainers.image.revision"}} {{.User}}')"
read -r l_version l_revision l_user <<<"$labels"
[ "$l_version" = "$VERSION" ] || fail "label version $l_version"
"$BIN" --version | grep -q "commit ${l_revision:0:12}" || fail "label revision $l_revision is not the binary's commit"
[ "$l_user" = "10001:10001" ] || fail "the image's user is $l_user"
size="$(podman image inspect "$IMAGE:$VERSION" --format '{{.Size}}')"
echo "image $IMAGE:$VERSION: $((size / 1000000)) MB, user $l_user, revision $l_revision"
for cmd in relay "ctl status" "ctl switchover" "ctl health" inspect verify bench; do
    # shellcheck disable=SC2086
    podman run --rm --read-only "$IMAGE:latest" $cmd --help >/dev/null || fail "the image has no '$cmd'"
done

# --- 3. The single overlay in podman kube play ---------------------------------------
say "the single overlay, played as a Deployment (kubeplay.py), the engines' clients through its forwarder"
PORT="$(freeport)"
KUBE_FILE="$TMP/single-kubeplay.yaml"
.venv-container/bin/python tests/container/kubeplay.py --image "localhost/hf3fs-meta:$VERSION=$IMAGE:$VERSION" \
    --suffix "$RUN" --port-map "http=$PORT" <"$TMP/render-single.yaml" >"$KUBE_FILE"
podman kube play "$KUBE_FILE" >/dev/null
CTR="hf3fs-meta-$RUN-pod-0-hf3fs-meta"
wait_health "http://127.0.0.1:$PORT" || { podman logs "$CTR"; fail "the played server never answered /health"; }
podman inspect "$CTR" --format '{{.Config.User}} {{.HostConfig.ReadonlyRootfs}} {{len .EffectiveCaps}}' | grep -qx '10001:10001 true 0' ||
    fail "the pod's security context (uid 10001, read-only root, no capabilities) is not applied: $(podman inspect "$CTR" --format '{{.Config.User}} {{.HostConfig.ReadonlyRootfs}} {{.EffectiveCaps}}')"
# The node-forward DaemonSet's command line, run by the host's socat with
# the Service's name replaced by the played pod's address.
FWD="$(freeport)"
mapfile -t fwd_args < <(python3 - "$TMP/render-single.yaml" "$FWD" "$PORT" <<'PY'
import sys, yaml
ds = next(d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"] == "DaemonSet")
for a in ds["spec"]["template"]["spec"]["containers"][0]["args"]:
    if a.startswith("TCP-LISTEN:18000,"):
        a = a.replace("TCP-LISTEN:18000,", f"TCP-LISTEN:{sys.argv[2]},")
    elif a.startswith("TCP:hf3fs-meta.kv-cache.svc.cluster.local:18000"):
        a = f"TCP:127.0.0.1:{sys.argv[3]}"
    else:
        sys.exit(f"unexpected forwarder argument {a}")
    print(a)
PY
)
socat "${fwd_args[@]}" &
SOCAT_PID=$!
trap 'set +e; kill $SOCAT_PID 2>/dev/null; cleanup' EXIT
wait_health "http://127.0.0.1:$FWD" || fail "the forwarder did not answer"
engines "http://127.0.0.1:$FWD" "$TMP/single.json"
kill "$SOCAT_PID"
wait "$SOCAT_PID" 2>/dev/null || true

say "played again on the same volume: every key saved before is still there"
podman kube down "$KUBE_FILE" >/dev/null
VOL="data-hf3fs-meta-0-$RUN"
podman volume exists "$VOL" || fail "kube down removed the data volume"
# Every role from the one image: verify and inspect read the volume while
# no server holds it (a read-only root; they copy the directory to /tmp).
podman run --rm --read-only --tmpfs /tmp -v "$VOL:/var/lib/hf3fs-meta" "$IMAGE:latest" verify --data-dir /var/lib/hf3fs-meta ||
    fail "verify of the volume"
podman run --rm --read-only --tmpfs /tmp -v "$VOL:/var/lib/hf3fs-meta" "$IMAGE:latest" inspect --data-dir /var/lib/hf3fs-meta --json >"$TMP/inspect.json" ||
    fail "inspect of the volume"
python3 - "$TMP/inspect.json" <<'PY'
import json, sys
s = json.dumps(json.load(open(sys.argv[1])))
assert '"keys"' in s, s[:400]
print("inspect: " + s[:160] + " ...")
PY
# The claim's volume is there already: kube play would refuse to make it
# again; the Deployment alone mounts it by its claim's name.
python3 -c 'import sys, yaml; yaml.safe_dump_all([d for d in yaml.safe_load_all(sys.stdin) if d["kind"] != "PersistentVolumeClaim"], sys.stdout)' \
    <"$KUBE_FILE" >"$TMP/single-again.yaml"
KUBE_FILE="$TMP/single-again.yaml"
podman kube play "$KUBE_FILE" >/dev/null
wait_health "http://127.0.0.1:$PORT" || { podman logs "$CTR"; fail "the played server did not come back"; }
engines "http://127.0.0.1:$PORT" "$TMP/single.json"
rss="$(grep VmRSS "/proc/$(podman inspect "$CTR" --format '{{.State.Pid}}')/status" | awk '{print $2}')"
echo "the server's resident memory after the runs: ${rss} kB"
podman kube down "$KUBE_FILE" >/dev/null
KUBE_FILE=""

# --- 4. The HA shape -----------------------------------------------------------------
say "HA: etcd on loopback, two servers and a relay from the ha overlay's environment"
ECLIENT="$(freeport)" EPEER="$(freeport)"
etcd --name m0 --data-dir "$TMP/etcd" --listen-client-urls "http://127.0.0.1:$ECLIENT" \
    --advertise-client-urls "http://127.0.0.1:$ECLIENT" --listen-peer-urls "http://127.0.0.1:$EPEER" \
    --initial-advertise-peer-urls "http://127.0.0.1:$EPEER" --initial-cluster "m0=http://127.0.0.1:$EPEER" \
    --heartbeat-interval 50 --election-timeout 500 >"$TMP/etcd.log" 2>&1 &
ETCD_PID=$!
ETCD="http://127.0.0.1:$ECLIENT"
for _ in $(seq 1 100); do curl -sf -m 1 "$ETCD/health" >/dev/null && break; sleep 0.1; done
curl -sf -m 1 "$ETCD/health" >/dev/null || { cat "$TMP/etcd.log"; fail "etcd did not start"; }
head -c 32 /dev/urandom | base64 >"$TMP/cluster-token"
chmod 644 "$TMP/cluster-token"
# env_of KIND NAME CONTAINER: the rendering's environment of that
# container as podman -e arguments (fieldRef values are set below).
env_of() {
    python3 - "$TMP/render-ha.yaml" "$@" <<'PY'
import sys, yaml
path, kind, name, container = sys.argv[1:]
d = next(d for d in yaml.safe_load_all(open(path)) if d and d["kind"] == kind and d["metadata"]["name"] == name)
c = next(c for c in d["spec"]["template"]["spec"]["containers"] if c["name"] == container)
for e in c.get("env", []):
    if "value" in e:
        print(f"-e={e['name']}={e['value']}")
PY
}
mapfile -t server_env < <(env_of StatefulSet hf3fs-meta hf3fs-meta)
mapfile -t relay_env < <(env_of DaemonSet hf3fs-meta-relay relay)
grep -q -- '-e=HF3FS_META_HA=etcd' <<<"${server_env[*]}" || fail "the ha overlay's server has no HF3FS_META_HA=etcd"
token_path="$(printf '%s\n' "${server_env[@]}" | sed -n 's/^-e=HF3FS_META_HA_TOKEN_FILE=//p')"
declare -A HTTP
start_server() { # node id
    local id="$1" port rport
    port="$(freeport)" rport="$(freeport)"
    HTTP[$id]="$port"
    # The rendering's environment, then what this machine changes: loopback
    # addresses and ports, etcd, the node's name (a fieldRef there), a 2 s
    # lease, and --ha-sync available (two nodes: with strict, the survivor
    # of a killed leader would answer no change until a standby returns).
    podman run -d --name "$RUN-$id" --label "hf3fs-meta-ci=$RUN" --network host --read-only \
        -v "$RUN-data-$id:/var/lib/hf3fs-meta" -v "$TMP/cluster-token:$token_path:ro" \
        "${server_env[@]}" \
        -e HF3FS_META_HOST=127.0.0.1 -e HF3FS_META_PORT="$port" -e HF3FS_META_NODE_ID="$id" \
        -e HF3FS_META_ETCD_ENDPOINTS="$ETCD" -e HF3FS_META_HA_CLUSTER="/$RUN" -e HF3FS_META_HA_LEASE_TTL=2 \
        -e HF3FS_META_ADVERTISE_URL="http://127.0.0.1:$port" \
        -e HF3FS_META_HA_REPLICATION_LISTEN="127.0.0.1:$rport" -e HF3FS_META_HA_REPLICATION_ADVERTISE="127.0.0.1:$rport" \
        -e HF3FS_META_HA_SYNC=available -e HF3FS_META_HEALTH_URL="http://127.0.0.1:$port" \
        "$IMAGE:latest" >/dev/null
}
start_server a
start_server b
RPORT="$(freeport)"
podman run -d --name "$RUN-relay" --label "hf3fs-meta-ci=$RUN" --network host --read-only \
    "${relay_env[@]}" -e HF3FS_META_RELAY_LISTEN="127.0.0.1:$RPORT" -e HF3FS_META_ETCD_ENDPOINTS="$ETCD" \
    -e HF3FS_META_HA_CLUSTER="/$RUN" -e HF3FS_META_HA_LEASE_TTL=2 -e HF3FS_META_HEALTH_URL="http://127.0.0.1:$RPORT" \
    "$IMAGE:latest" relay >/dev/null
for id in a b; do wait_health "http://127.0.0.1:${HTTP[$id]}" || { podman logs "$RUN-$id"; fail "server $id did not start"; }; done
RELAY="http://127.0.0.1:$RPORT"
# role_of ID: the node's HA role from its /health.
role_of() { curl -sf -m 2 "http://127.0.0.1:${HTTP[$1]}/health" | python3 -c 'import json,sys; print(json.load(sys.stdin).get("ha",{}).get("role",""))' 2>/dev/null || true; }
leader=""
for _ in $(seq 1 200); do
    for id in a b; do [ "$(role_of "$id")" = leader ] && leader="$id"; done
    [ -n "$leader" ] && break
    sleep 0.1
done
[ -n "$leader" ] || fail "no leader within 20 s"
follower="$([ "$leader" = a ] && echo b || echo a)"
echo "leader $leader, follower $follower"
engines "$RELAY" "$TMP/ha.json"

say "the image's health check on each container"
for c in "$RUN-a" "$RUN-b" "$RUN-relay"; do
    podman healthcheck run "$c" >/dev/null || fail "the health check of $c failed"
done
st=0
podman run --rm --network host "$IMAGE:latest" ctl health --url "http://127.0.0.1:$(freeport)" 2>/dev/null || st=$?
[ "$st" -eq 1 ] || fail "ctl health against no listener: exit $st, expected 1"
echo "healthy: $RUN-a, $RUN-b, $RUN-relay; no listener: exit 1"

say "the preStop hook: ctl switchover --if-leader on the follower (nothing to do), then on the leader"
out="$(podman exec "$RUN-$follower" /usr/local/bin/hf3fs-meta ctl switchover --if-leader --timeout 20)" ||
    fail "preStop on the follower: $out"
grep -q "does not lead" <<<"$out" || fail "preStop on the follower: $out"
[ "$(role_of "$leader")" = leader ] || fail "the follower's preStop moved the leadership"
# The standby must be caught up (named in P/sync) before it can take over.
for _ in $(seq 1 200); do
    curl -sf -m 2 "http://127.0.0.1:${HTTP[$follower]}/ready" >/dev/null && break
    sleep 0.1
done
out="$(podman exec "$RUN-$leader" /usr/local/bin/hf3fs-meta ctl switchover --if-leader --timeout 20)" ||
    fail "preStop on the leader: $out"
echo "$out"
[ "$(role_of "$follower")" = leader ] || fail "after the leader's preStop, $follower does not lead"
engines "$RELAY" "$TMP/ha.json"
leader="$follower"
follower="$([ "$leader" = a ] && echo b || echo a)"

say "SIGKILL of the leader container ($leader): the relay follows, the clients carry on"
for _ in $(seq 1 200); do
    curl -sf -m 2 "http://127.0.0.1:${HTTP[$follower]}/ready" >/dev/null && break
    sleep 0.1
done
podman kill -s KILL "$RUN-$leader" >/dev/null
engines "$RELAY" "$TMP/ha.json"
[ "$(role_of "$follower")" = leader ] || fail "$follower did not take over"
rss="$(grep VmRSS "/proc/$(podman inspect "$RUN-relay" --format '{{.State.Pid}}')/status" | awk '{print $2}')"
echo "the relay's resident memory after the runs: ${rss} kB"

# --- 5. TLS as the tls overlay mounts it, and a renewal ----------------------------
say "TLS: the tls overlay's environment and probes, a secret volume renewed as the kubelet does it"
# A CA and two certificates for the node (30 and 60 days).
(
    cd "$TMP" && mkdir -p certs && cd certs
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca.key -out ca.crt \
        -days 90 -subj /CN=hf3fs-meta-ci-ca
    for days in 30 60; do
        openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "tls-$days.key" -out "tls-$days.csr" -subj /CN=node
        printf 'subjectAltName=DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n' >ext
        openssl x509 -req -in "tls-$days.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days "$days" -extfile ext -out "tls-$days.crt"
    done
) >/dev/null 2>&1 || fail "openssl could not make the test certificates"
# The kubelet's layout of a secret volume: a timestamped directory, ..data
# pointing at it, each key a link through ..data; a renewal writes a new
# directory and renames a new ..data over the old one.
VOLDIR="$TMP/tls-volume"
secret_version() { # name days
    mkdir -p "$VOLDIR/$1"
    cp "$TMP/certs/tls-$2.crt" "$VOLDIR/$1/tls.crt"
    cp "$TMP/certs/tls-$2.key" "$VOLDIR/$1/tls.key"
    cp "$TMP/certs/ca.crt" "$VOLDIR/$1/ca.crt"
    chmod 644 "$VOLDIR/$1"/*
    ln -sfn "$1" "$VOLDIR/..data_tmp"
    mv -T "$VOLDIR/..data_tmp" "$VOLDIR/..data"
}
secret_version ..2026_12_07_first 30
for f in tls.crt tls.key ca.crt; do ln -s "..data/$f" "$VOLDIR/$f"; done
mapfile -t tls_env < <(python3 - "$TMP/render-tls.yaml" <<'PY'
import sys, yaml
d = next(d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"] == "StatefulSet" and d["metadata"]["name"] == "hf3fs-meta")
c = d["spec"]["template"]["spec"]["containers"][0]
for e in c["env"]:
    if e["name"] in ("HF3FS_META_TLS_CERT", "HF3FS_META_TLS_KEY", "HF3FS_META_TLS_CLIENT_CA"):
        print(f"-e={e['name']}={e['value']}")
mount = next(m["mountPath"] for m in c["volumeMounts"] if m["name"] == "tls")
print(f"--mount={mount}")
print("--probe=" + "\x1f".join(c["readinessProbe"]["exec"]["command"]))
PY
)
tls_mount="$(printf '%s\n' "${tls_env[@]}" | sed -n 's/^--mount=//p')"
IFS=$'\x1f' read -r -a probe <<<"$(printf '%s\n' "${tls_env[@]}" | sed -n 's/^--probe=//p')"
mapfile -t tls_env < <(printf '%s\n' "${tls_env[@]}" | grep '^-e=')
if [ ${#tls_env[@]} -ne 3 ] || [ -z "$tls_mount" ] || [ ${#probe[@]} -lt 3 ]; then
    fail "the tls overlay's server: TLS variables, mount or probe missing"
fi
TPORT="$(freeport)" PPORT="$(freeport)"
podman run -d --name "$RUN-tls" --label "hf3fs-meta-ci=$RUN" --network host --read-only \
    -v "$RUN-data-tls:/var/lib/hf3fs-meta" -v "$VOLDIR:$tls_mount:ro" "${tls_env[@]}" \
    -e HF3FS_META_HOST=127.0.0.1 -e HF3FS_META_PORT="$TPORT" -e HF3FS_META_PLAIN_LISTEN="127.0.0.1:$PPORT" \
    -e HF3FS_META_HEALTH_URL="http://127.0.0.1:$PPORT" "$IMAGE:latest" >/dev/null
wait_health "http://127.0.0.1:$PPORT" || { podman logs "$RUN-tls"; fail "the TLS server's plain listener never answered"; }
code="$(curl -s -o /dev/null -w '%{http_code}' -m 2 "http://127.0.0.1:$TPORT/health" || true)"
[ "$code" = 400 ] || fail "plain HTTP on the TLS port answered $code, expected 400"
podman exec "$RUN-tls" "${probe[@]}" || fail "the tls overlay's readiness probe (${probe[*]}) failed"
podman healthcheck run "$RUN-tls" >/dev/null || fail "the image's health check (HF3FS_META_HEALTH_URL) failed on the TLS server"
expiry() { curl -sf -m 2 "http://127.0.0.1:$PPORT/metrics" | awk '/^hf3fs_meta_tls_certificate_expiry_seconds\{role="server"\}/ { print $2 }'; }
before="$(expiry)"
[ -n "$before" ] || fail "no hf3fs_meta_tls_certificate_expiry_seconds{role=\"server\"}"
secret_version ..2026_12_07_renewed 60
# The server checks its files every 10 s: bounded by 30 s.
after="$before"
for _ in $(seq 1 300); do
    after="$(expiry)"
    [ "$after" != "$before" ] && break
    sleep 0.1
done
[ "$after" != "$before" ] || fail "the renewed certificate was not loaded within 30 s (expiry still $before)"
python3 -c "import sys; b, a = float(sys.argv[1]), float(sys.argv[2]); assert 29 * 86400 < a - b < 31 * 86400, (b, a)" "$before" "$after" ||
    fail "the expiry moved from $before to $after, not by 30 days"
podman exec "$RUN-tls" "${probe[@]}" || fail "the readiness probe after the renewal"
echo "renewed in place: the server's certificate expiry moved from $before to $after, no restart"

say "container tests passed"
