#!/usr/bin/env bash
# Checks contrib/: the Prometheus alert rules and the systemd unit.
#
#   .ci/contrib.sh [SERVER_BINARY]      (default: target/ci/hf3fs-meta)
#
# 1. promtool check rules, promtool test rules, and every alert of the rules
#    file has a test where it fires and one where it does not; the Grafana
#    dashboard's queries parse (tests/ha/grafana_dashboard.rs checks its names);
# 2. a live server (the binary, --data-dir in a temporary directory, a free
#    port): after requests on both dialects, every hf3fs_meta_* name the
#    rules and their tests use is in its /metrics, with the labels and label
#    values they match on; its durable store, made to fail and recover,
#    moves hf3fs_meta_durable_healthy and /health as the alerts expect;
#    the HA series (hf3fs_meta_ha_*) come from a second server started with
#    --ha etcd on one etcd member on loopback, once it serves as leader;
#    the relay, started as its unit starts it, reaches that leader and
#    exits 0 on SIGTERM;
# 3. the exit statuses the unit relies on: 0 after SIGTERM within the
#    unit's TimeoutStopSec, 75 on a fatal durable failure, 2 on a bad
#    configuration;
# 4. systemd-analyze verify on both units, the server's and the relay's
#    (ExecStart pointed at the binary; any warning fails), their offline
#    security exposure stays at or below 2.0, and every flag and
#    HF3FS_META_* variable of contrib/systemd is one the binary (or its
#    relay subcommand) knows.
#
# Installs what it needs from Debian when missing (prometheus for promtool,
# systemd for systemd-analyze, curl, etcd-server, python3-yaml) without
# starting any service. Bounded: the whole script runs under `timeout 600`;
# the servers, the relay and etcd are killed on any exit.
set -euo pipefail

if [ -z "${HF3FS_CONTRIB_TIMED:-}" ]; then
    export HF3FS_CONTRIB_TIMED=1
    exec timeout -k 10 600 bash "$0" "$@"
fi

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT="$PWD"
BIN="${1:-target/ci/hf3fs-meta}"
case "$BIN" in /*) ;; *) BIN="$ROOT/$BIN" ;; esac
[ -x "$BIN" ] || { echo "contrib.sh: no server binary at $BIN (build it first)" >&2; exit 1; }
RULES=contrib/prometheus/hf3fs-meta.rules.yml
TESTS=contrib/prometheus/hf3fs-meta.rules.test.yml
UNIT=contrib/systemd/hf3fs-meta.service
ENVFILE=contrib/systemd/hf3fs-meta.env
RELAY_UNIT=contrib/systemd/hf3fs-meta-relay.service
RELAY_ENVFILE=contrib/systemd/hf3fs-meta-relay.env

say() { printf '\n--> %s\n' "$*"; }
fail() { echo "contrib.sh: FAILED: $*" >&2; exit 1; }

TMP="$(mktemp -d)"
SERVER_PID=""
HA_PID=""
RELAY_PID=""
ETCD_PID=""
TLS_PID=""
cleanup() {
    local pid
    for pid in "$SERVER_PID" "$RELAY_PID" "$HA_PID" "$ETCD_PID" "$TLS_PID"; do
        if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
            kill -KILL "$pid" 2>/dev/null || true
            wait "$pid" 2>/dev/null || true
        fi
    done
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- Debian packages ----------------------------------------------------------
say "Debian packages (promtool, systemd-analyze, curl, etcd, python3-yaml)"
need=()
command -v promtool >/dev/null || need+=(prometheus)
command -v systemd-analyze >/dev/null || need+=(systemd)
command -v curl >/dev/null || need+=(curl)
command -v openssl >/dev/null || need+=(openssl)
command -v etcd >/dev/null || need+=(etcd-server)
python3 -c 'import yaml' 2>/dev/null || need+=(python3-yaml)
if [ ${#need[@]} -gt 0 ]; then
    # The prometheus package would start a Prometheus server on :9090 where
    # an init system runs: forbid starting services for this install.
    guard=""
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
        chmod +x /usr/sbin/policy-rc.d
        guard=1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
    [ -n "$guard" ] && rm -f /usr/sbin/policy-rc.d
fi
promtool --version 2>&1 | head -1
systemd-analyze --version | head -1

# --- 1. The rules ---------------------------------------------------------------
say "promtool check rules"
promtool check rules "$RULES"

say "promtool test rules"
(cd contrib/prometheus && promtool test rules "$(basename "$TESTS")")

say "every alert has a firing and a quiet test case"
python3 - "$RULES" "$TESTS" <<'EOF'
import sys, yaml
rules = yaml.safe_load(open(sys.argv[1]))
tests = yaml.safe_load(open(sys.argv[2]))
alerts = [r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r]
fires, quiet = set(), set()
for t in tests["tests"]:
    for c in t.get("alert_rule_test", []):
        (fires if c.get("exp_alerts") else quiet).add(c["alertname"])
bad = [f"{a}: no case where it fires" for a in alerts if a not in fires]
bad += [f"{a}: no case where it stays quiet" for a in alerts if a not in quiet]
bad += [f"{a}: tested but not in the rules" for a in sorted((fires | quiet) - set(alerts))]
for g in rules["groups"]:
    for r in g["rules"]:
        if "alert" not in r:
            continue
        for need in ("for",):
            if need not in r:
                bad.append(f"{r['alert']}: no {need}:")
        if r.get("labels", {}).get("severity") not in ("critical", "warning", "info"):
            bad.append(f"{r['alert']}: severity must be critical, warning or info")
        for a in ("summary", "description", "runbook"):
            if not r.get("annotations", {}).get(a):
                bad.append(f"{r['alert']}: no {a} annotation")
if bad:
    sys.exit("\n".join(bad))
print(f"{len(alerts)} alerts, each fires and stays quiet in {sys.argv[2]}")
EOF

say "the Grafana dashboard's queries parse as PromQL (promtool, Grafana variables substituted)"
python3 - contrib/grafana/hf3fs-meta.json >"$TMP/dashboard.rules.yml" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
print("groups:\n  - name: dashboard\n    rules:")
for p in d["panels"]:
    for t in p.get("targets", []):
        e = t["expr"].replace("$__rate_interval", "5m").replace("$instance", ".*")
        print(f"      - record: dashboard:panel{p['id']}:{t['refId']}\n        expr: {json.dumps(e)}")
EOF
promtool check rules "$TMP/dashboard.rules.yml"

# --- 2. A live server: the names the rules use are the names it exports --------
start_server() { # $1: log file; the rest: extra flags
    local log="$1"
    shift
    "$BIN" --host 127.0.0.1 --port 0 --workers 2 "$@" >"$log" 2>&1 &
    SERVER_PID=$!
    ADDR=""
    for _ in $(seq 1 300); do
        ADDR="$(grep -o 'listening addr=[0-9.:]*' "$log" | head -1 | cut -d= -f2 || true)"
        [ -n "$ADDR" ] && break
        kill -0 "$SERVER_PID" 2>/dev/null || { cat "$log"; fail "the server exited at start"; }
        sleep 0.1
    done
    [ -n "$ADDR" ] || { cat "$log"; fail "the server did not log its address within 30 s"; }
    BASE="http://$ADDR"
}
# Waits up to $1 seconds for the server to exit; sets EXIT_STATUS.
wait_exit() {
    local i
    for i in $(seq 1 $(($1 * 10))); do
        kill -0 "$SERVER_PID" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$SERVER_PID" 2>/dev/null; then
        return 1
    fi
    EXIT_STATUS=0
    wait "$SERVER_PID" || EXIT_STATUS=$?
    SERVER_PID=""
}
post() { # path body -> HTTP status
    curl -s -m 5 -o /dev/null -w '%{http_code}' -X POST "$BASE$1" -H 'Content-Type: application/json' -d "$2"
}
expect() { # what want got
    [ "$2" = "$3" ] || fail "$1: expected $2, got $3"
}

say "live server with --data-dir: requests on both dialects, then /metrics"
DATA="$TMP/data"
FAULTS="$TMP/faults"
: >"$FAULTS"
start_server "$TMP/server.log" --data-dir "$DATA" --durable-faults "$FAULTS" \
    --kv-events-endpoint tcp://127.0.0.1:0 --kv-events-bind # the KV-event series (port 0: the OS picks)
echo "server on $ADDR (pid $SERVER_PID)"
expect "vLLM initialize" 200 "$(post /rank/0/initialize '{"num_pages":8}')"
alloc="$(curl -s -m 5 -X POST "$BASE/keys/batch_allocate" -d '{"rank":0,"keys":[["a",""],["b",""]]}')"
pa="$(python3 -c 'import json,sys; r=json.loads(sys.argv[1])["results"]; print(r[0][1], r[1][1])' "$alloc")"
read -r page_a page_b <<<"$pa"
expect "vLLM confirm" 204 "$(post /keys/confirm_write "{\"rank\":0,\"confirmations\":[[\"a\",$page_a]],\"pages_to_release\":[$page_b]}")"
expect "vLLM confirm of a free page (typed 500)" 500 "$(post /keys/confirm_write '{"rank":0,"confirmations":[["c",7]]}')"
expect "vLLM batch_exists" 200 "$(post /keys/batch_exists '{"keys":["a","z"]}')"
expect "vLLM get_locations" 200 "$(post /keys/get_locations '{"rank":0,"keys":["a"]}')"
expect "SGLang initialize" 204 "$(post /0/initialize '{"num_pages":4,"namespace":"kv"}')"
expect "SGLang reserve" 200 "$(post /0/reserve_and_allocate_page_indices '{"keys":[["x",""]],"namespace":"kv"}')"
expect "SGLang exists" 200 "$(post /0/exists '{"keys":["x"],"namespace":"kv"}')"
expect "/stats" 200 "$(curl -s -m 5 -o /dev/null -w '%{http_code}' "$BASE/stats")"
curl -sf -m 5 "$BASE/metrics" >/dev/null # so that the ops dialect's /metrics series exist
curl -sf -m 5 "$BASE/metrics" >"$TMP/metrics.txt"

say "live server with --ha etcd (one etcd member on loopback): leader, then its /metrics"
# shellcheck source=perf/lib.sh
source perf/lib.sh  # free_port
etcd_client="$(free_port)"
etcd_peer="$(free_port)"
etcd --name contrib --data-dir "$TMP/etcd" \
    --listen-client-urls "http://127.0.0.1:$etcd_client" --advertise-client-urls "http://127.0.0.1:$etcd_client" \
    --listen-peer-urls "http://127.0.0.1:$etcd_peer" --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer" \
    --initial-cluster "contrib=http://127.0.0.1:$etcd_peer" --initial-cluster-state new \
    --initial-cluster-token hf3fs-meta-contrib --heartbeat-interval 50 --election-timeout 500 \
    --log-level error >"$TMP/etcd.log" 2>&1 &
ETCD_PID=$!
ETCD_URL="http://127.0.0.1:$etcd_client"
for _ in $(seq 1 300); do
    curl -s -m 2 "$ETCD_URL/health" 2>/dev/null | grep -q '"health":"true"' && break
    kill -0 "$ETCD_PID" 2>/dev/null || { cat "$TMP/etcd.log"; fail "etcd exited at start"; }
    sleep 0.1
done
curl -s -m 2 "$ETCD_URL/health" | grep -q '"health":"true"' || { cat "$TMP/etcd.log"; fail "etcd not healthy within 30 s"; }
echo "contrib-check-secret" >"$TMP/ha-token"
ha_port="$(free_port)"
"$BIN" --host 127.0.0.1 --port "$ha_port" --workers 2 --data-dir "$TMP/ha-data" \
    --ha etcd --etcd-endpoints "$ETCD_URL" --ha-cluster /contrib-check --node-id a \
    --advertise-url "http://127.0.0.1:$ha_port" --ha-lease-ttl 2 --ha-token-file "$TMP/ha-token" \
    >"$TMP/ha.log" 2>&1 &
HA_PID=$!
HA_BASE="http://127.0.0.1:$ha_port"
role=""
# A first leader waits out one lease TTL (2 s) before serving.
for _ in $(seq 1 300); do
    role="$(curl -s -m 2 "$HA_BASE/health" 2>/dev/null | python3 -c 'import json,sys
try: h=json.load(sys.stdin)["ha"]; print(h["role"] if h["serving"] else "not-serving")
except Exception: print("")' || true)"
    [ "$role" = leader ] && break
    kill -0 "$HA_PID" 2>/dev/null || { cat "$TMP/ha.log"; fail "the --ha etcd server exited at start"; }
    sleep 0.1
done
[ "$role" = leader ] || { tail -20 "$TMP/ha.log"; fail "the --ha etcd server did not serve as leader within 30 s (role: ${role:-none})"; }
echo "node a leads on $HA_BASE (etcd $ETCD_URL)"
curl -sf -m 5 "$HA_BASE/metrics" >"$TMP/ha-metrics.txt"
grep -q '^hf3fs_meta_ha_role{role="leader"} 1$' "$TMP/ha-metrics.txt" ||
    fail "the leader's /metrics has no hf3fs_meta_ha_role{role=\"leader\"} 1"
cat "$TMP/ha-metrics.txt" >>"$TMP/metrics.txt"

say "live server with TLS (a certificate made now): its /metrics through --plain-listen"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 30 -subj /CN=127.0.0.1 \
    -addext subjectAltName=IP:127.0.0.1 -keyout "$TMP/tls.key" -out "$TMP/tls.pem" 2>/dev/null ||
    fail "openssl could not make a test certificate"
tls_port="$(free_port)"
tls_plain="$(free_port)"
"$BIN" --host 127.0.0.1 --port "$tls_port" --workers 1 --tls-cert "$TMP/tls.pem" --tls-key "$TMP/tls.key" \
    --plain-listen "127.0.0.1:$tls_plain" >"$TMP/tls.log" 2>&1 &
TLS_PID=$!
for _ in $(seq 1 300); do
    curl -sf -m 2 "http://127.0.0.1:$tls_plain/metrics" >"$TMP/tls-metrics.txt" 2>/dev/null && break
    kill -0 "$TLS_PID" 2>/dev/null || { cat "$TMP/tls.log"; fail "the TLS server exited at start"; }
    sleep 0.1
done
grep -q '^hf3fs_meta_tls_certificate_expiry_seconds{role="server"} ' "$TMP/tls-metrics.txt" ||
    { tail -20 "$TMP/tls.log"; fail "the TLS server's /metrics has no certificate expiry"; }
cat "$TMP/tls-metrics.txt" >>"$TMP/metrics.txt"

say "the relay (as its unit starts it, on a free port) forwards to the leader; SIGTERM exits 0"
relay_port="$(free_port)"
"$BIN" relay --listen "127.0.0.1:$relay_port" --etcd-endpoints "$ETCD_URL" --ha-cluster /contrib-check \
    --ha-lease-ttl 2 >"$TMP/relay.log" 2>&1 &
RELAY_PID=$!
via=""
for _ in $(seq 1 300); do
    via="$(curl -s -m 2 "http://127.0.0.1:$relay_port/health" 2>/dev/null || true)"
    grep -q '"role":"leader"' <<<"$via" && break
    kill -0 "$RELAY_PID" 2>/dev/null || { cat "$TMP/relay.log"; fail "the relay exited at start"; }
    sleep 0.1
done
grep -q '"node":"a"' <<<"$via" && grep -q '"role":"leader"' <<<"$via" ||
    { tail -20 "$TMP/relay.log"; fail "/health through the relay did not reach leader a within 30 s: $via"; }
echo "through the relay: $via"
relay_stop="$(sed -n 's/^TimeoutStopSec=//p' "$RELAY_UNIT" | sed 's/s$//')"
[ -n "$relay_stop" ] || fail "$RELAY_UNIT: no TimeoutStopSec"
kill -TERM "$RELAY_PID"
st=""
for _ in $(seq 1 $((relay_stop * 10))); do
    kill -0 "$RELAY_PID" 2>/dev/null || break
    sleep 0.1
done
kill -0 "$RELAY_PID" 2>/dev/null && fail "the relay did not stop within ${relay_stop} s of SIGTERM"
st=0
wait "$RELAY_PID" || st=$?
RELAY_PID=""
expect "relay exit status after SIGTERM" 0 "$st"
kill -TERM "$HA_PID" 2>/dev/null || true
wait "$HA_PID" 2>/dev/null || true
HA_PID=""
kill -TERM "$ETCD_PID" 2>/dev/null || true
wait "$ETCD_PID" 2>/dev/null || true
ETCD_PID=""

say "every hf3fs_meta_* name, label and label value of the rules and their tests is exported"
python3 - "$RULES" "$TESTS" "$TMP/metrics.txt" <<'EOF'
import re, sys, yaml
rules = yaml.safe_load(open(sys.argv[1]))
tests = yaml.safe_load(open(sys.argv[2]))
scrape = open(sys.argv[3]).read()

# name -> {label -> {values}} of the scrape
exported = {}
for line in scrape.splitlines():
    if not line or line.startswith("#"):
        continue
    m = re.match(r'([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s', line)
    labels = exported.setdefault(m.group(1), {})
    for k, v in re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""):
        labels.setdefault(k, set()).add(v)
all_labels = {l for ls in exported.values() for l in ls} | {"job", "instance"}
TARGET = {"job", "instance"}
# Label values that name places or counts, which differ between servers.
FREE_VALUES = {"rank", "namespace", "status", "job", "instance"}

problems = []
def check(where, name, matchers):
    if name not in exported:
        problems.append(f"{where}: {name} is not exported by the server")
        return
    for label, op, value in matchers:
        if label in TARGET:
            continue
        if label not in exported[name]:
            problems.append(f"{where}: {name} has no label {label} (it has {sorted(exported[name])})")
        elif op in ("=", "!=") and label not in FREE_VALUES and value not in exported[name][label]:
            problems.append(f"{where}: {name}{{{label}{op}\"{value}\"}}: the server exports {label} = {sorted(exported[name][label])}")

SEL = re.compile(r'(hf3fs_meta_\w+)(\{([^}]*)\})?')
MATCH = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')
used = set()
for g in rules["groups"]:
    for r in g["rules"]:
        where = f"rule {r.get('alert') or r.get('record')}"
        expr = r["expr"]
        for m in SEL.finditer(expr):
            used.add(m.group(1))
            check(where, m.group(1), MATCH.findall(m.group(3) or ""))
        for m in re.finditer(r'\b(by|without|on|ignoring)\s*\(([^)]*)\)', expr):
            for l in [x.strip() for x in m.group(2).split(",") if x.strip()]:
                if l not in all_labels:
                    problems.append(f"{where}: {m.group(1)} ({l}): no exported metric has a label {l}")
        for text in list(r.get("annotations", {}).values()):
            for m in SEL.finditer(text):
                check(where + " (annotation)", m.group(1), [])
for t in tests["tests"]:
    for s in t.get("input_series", []):
        m = SEL.match(s["series"])
        if not m:
            continue  # up{...}: Prometheus's own series
        check(f"test '{t.get('name')}'", m.group(1), MATCH.findall(m.group(3) or ""))
problems = sorted(set(problems))
if problems:
    sys.exit("\n".join(problems))
print(f"{len(used)} metric names used by the rules, all exported with the labels the rules and tests use")
EOF

say "the durable store fails and recovers: /health and hf3fs_meta_durable_healthy follow"
metric() { curl -sf -m 5 "$BASE/metrics" | awk -v s="$1" 'index($0, s" ") == 1 { print $2 }'; }
health() { curl -s -m 5 -o /dev/null -w '%{http_code}' "$BASE/health"; }
expect "/health while healthy" 200 "$(health)"
expect 'hf3fs_meta_durable_healthy{store="vllm"} while healthy' 1 "$(metric 'hf3fs_meta_durable_healthy{store="vllm"}')"
healthy() { # store -> the gauge
    metric "hf3fs_meta_durable_healthy{store=\"$1\"}"
}
echo "write=enospc" >"$FAULTS"
# Each store (vllm, sglang) notices at its next write or its once-a-second probe.
for _ in $(seq 1 100); do
    [ "$(health)" = 503 ] && [ "$(healthy vllm)" = 0 ] && [ "$(healthy sglang)" = 0 ] && break
    sleep 0.1
done
expect "/health with a full disk" 503 "$(health)"
expect 'hf3fs_meta_durable_healthy{store="vllm"} with a full disk' 0 "$(healthy vllm)"
expect 'hf3fs_meta_durable_healthy{store="sglang"} with a full disk' 0 "$(healthy sglang)"
: >"$FAULTS"
# Retries after 1, 2, 4, 8 s, then every 10 s: back within about 15 s.
for _ in $(seq 1 300); do
    [ "$(health)" = 200 ] && [ "$(healthy vllm)" = 1 ] && [ "$(healthy sglang)" = 1 ] && break
    sleep 0.1
done
expect "/health once the disk takes writes again" 200 "$(health)"
expect 'hf3fs_meta_durable_healthy{store="vllm"} after recovery' 1 "$(healthy vllm)"
expect 'hf3fs_meta_durable_healthy{store="sglang"} after recovery' 1 "$(healthy sglang)"
rec="$(metric 'hf3fs_meta_durable_recoveries_total{store="vllm"}')"
[ "${rec:-0}" -ge 1 ] || fail "hf3fs_meta_durable_recoveries_total{store=\"vllm\"} is ${rec:-missing} after a recovery"

# --- 3. Exit statuses the unit relies on ------------------------------------------
read_unit() { sed -n "s/^$1=//p" "$UNIT" | tail -1; }
shutdown_timeout="$(read_unit Environment | sed -n 's/^HF3FS_META_SHUTDOWN_TIMEOUT=//p')"
stop_timeout="$(read_unit TimeoutStopSec | sed 's/s$//')"
[ -n "$shutdown_timeout" ] && [ -n "$stop_timeout" ] || fail "$UNIT: no HF3FS_META_SHUTDOWN_TIMEOUT or TimeoutStopSec"
[ "$stop_timeout" -gt "$shutdown_timeout" ] ||
    fail "$UNIT: TimeoutStopSec ($stop_timeout) must be above the shutdown timeout ($shutdown_timeout)"

say "SIGTERM (the unit's KillSignal): exit 0 within TimeoutStopSec=${stop_timeout}s"
kill -TERM "$SERVER_PID"
wait_exit "$stop_timeout" || fail "the server did not stop within ${stop_timeout} s of SIGTERM"
expect "exit status after SIGTERM" 0 "$EXIT_STATUS"

say "a fatal durable failure exits 75 (restarted by the unit: not in RestartPreventExitStatus)"
start_server "$TMP/server2.log" --data-dir "$DATA" --durable-faults "$FAULTS"
expect "recovered rank after restart (initialize answers 200)" 200 "$(post /rank/0/initialize '{"num_pages":8}')"
echo "write=panic" >"$FAULTS"
post /rank/1/initialize '{"num_pages":8}' >/dev/null || true
wait_exit 20 || fail "the server did not exit within 20 s of a fatal durable failure"
expect "exit status after a fatal durable failure" 75 "$EXIT_STATUS"
grep -q "exiting with status 75" "$TMP/server2.log" || fail "no 'exiting with status 75' line in the log"
grep -qx 'RestartPreventExitStatus=.*\b75\b.*' "$UNIT" && fail "$UNIT: 75 must be restarted"
grep -qx 'SuccessExitStatus=.*\b75\b.*' "$UNIT" && fail "$UNIT: 75 is a failure"

say "a bad configuration exits 2 (RestartPreventExitStatus=2)"
st=0
timeout 20 "$BIN" --port 0 --evict-low-watermark 0.99 --evict-high-watermark 0.5 >/dev/null 2>&1 || st=$?
expect "exit status with crossed watermarks" 2 "$st"
st=0
timeout 20 "$BIN" --no-such-flag >/dev/null 2>&1 || st=$?
expect "exit status with an unknown flag" 2 "$st"
grep -qx 'RestartPreventExitStatus=2' "$UNIT" || fail "$UNIT: RestartPreventExitStatus=2 expected"

# --- 4. The unit -------------------------------------------------------------------
say "flags and HF3FS_META_* variables of contrib/systemd are the binary's"
help="$("$BIN" --help)"
exec_start="$(read_unit ExecStart)"
case "$exec_start" in /usr/local/bin/hf3fs-meta\ *) ;; *) fail "$UNIT: ExecStart should start with /usr/local/bin/hf3fs-meta" ;; esac
for flag in $(grep -o -- '--[a-z][a-z-]*' <<<"$exec_start"); do
    grep -q -- "$flag " <<<"$help" || fail "$UNIT: ExecStart flag $flag is not in hf3fs-meta --help"
done
for var in $(grep -oh 'HF3FS_META_[A-Z][A-Z_]*' "$UNIT" "$ENVFILE" | sort -u); do
    grep -qE "env: ${var}[]=]" <<<"$help" || fail "contrib/systemd: $var is not in hf3fs-meta --help"
done

# $1: the unit file. Copies it with ExecStart pointed at $BIN, verifies it
# (any warning fails) and checks its offline exposure stays at most 2.0.
verify_unit() {
    local unit="$1" name
    name="$(basename "$unit")"
    say "systemd-analyze verify $name (ExecStart pointed at $BIN)"
    mkdir -p "$TMP/unit"
    sed "s#^ExecStart=/usr/local/bin/hf3fs-meta\b#ExecStart=$BIN#" "$unit" >"$TMP/unit/$name"
    grep -q "^ExecStart=$BIN\b" "$TMP/unit/$name" || fail "could not point ExecStart of $name at $BIN"
    out="$(cd "$TMP/unit" && systemd-analyze verify --man=no "./$name" 2>&1)" || {
        echo "$out"
        fail "systemd-analyze verify $name"
    }
    [ -z "$out" ] || {
        echo "$out"
        fail "systemd-analyze verify $name warned (unknown keys and bad values are only warnings)"
    }
    echo "verified: no warning"
    say "systemd-analyze security --offline $name: exposure at most 2.0"
    (cd "$TMP/unit" && systemd-analyze security --offline=yes --threshold=20 "./$name" | tail -1) ||
        fail "the exposure of $name rose above 2.0 (systemd-analyze security --offline=yes $unit)"
}
verify_unit "$UNIT"

say "the relay unit: flags and HF3FS_META_* variables are the relay's"
relay_help="$("$BIN" relay --help)"
relay_exec="$(sed -n 's/^ExecStart=//p' "$RELAY_UNIT" | tail -1)"
case "$relay_exec" in /usr/local/bin/hf3fs-meta\ relay\ *) ;; *) fail "$RELAY_UNIT: ExecStart should start with /usr/local/bin/hf3fs-meta relay" ;; esac
for flag in $(grep -o -- '--[a-z][a-z-]*' <<<"$relay_exec"); do
    grep -q -- "$flag " <<<"$relay_help" || fail "$RELAY_UNIT: ExecStart flag $flag is not in hf3fs-meta relay --help"
done
grep -q -- '--listen 127\.0\.0\.1:' <<<"$relay_exec" || fail "$RELAY_UNIT: the relay must listen on loopback"
for var in $(grep -oh 'HF3FS_META_[A-Z][A-Z_]*' "$RELAY_UNIT" "$RELAY_ENVFILE" | sort -u); do
    grep -qE "env: ${var}[]=]" <<<"$relay_help" || fail "$RELAY_UNIT or $RELAY_ENVFILE: $var is not in hf3fs-meta relay --help"
done
for var in HF3FS_META_ETCD_ENDPOINTS HF3FS_META_HA_CLUSTER; do
    grep -q "^$var=" "$RELAY_ENVFILE" || fail "$RELAY_ENVFILE: $var (required) is not set"
done
grep -q '^EnvironmentFile=/etc/hf3fs-meta/hf3fs-meta-relay.env$' "$RELAY_UNIT" ||
    fail "$RELAY_UNIT: EnvironmentFile=/etc/hf3fs-meta/hf3fs-meta-relay.env (required) expected"
grep -q '^Restart=always$' "$RELAY_UNIT" || fail "$RELAY_UNIT: Restart=always expected"
grep -q '^StateDirectory=' "$RELAY_UNIT" && fail "$RELAY_UNIT: the relay keeps no state"
verify_unit "$RELAY_UNIT"

say "contrib checks passed"
