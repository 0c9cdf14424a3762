#!/usr/bin/env bash
# The rolling upgrade, end to end: a 3-node HA cluster of the previous
# release (a pinned commit of this repository, built from its own history)
# under the engines' request sequences through the relay goes to this
# release node by node, then one node goes back (the downgrade that is
# possible), with the load running throughout:
#
#   1. three nodes of the previous release (--data-dir, --fsync always,
#      --ha-sync strict, a 2 s lease), one relay, one etcd member;
#      tests/upgrade/load.py saves and loads through the relay (vLLM's and
#      SGLang's sequences) from here to the end;
#   2. the spare (neither leader nor standby) and then the synchronous
#      standby are stopped (SIGTERM) and started on this release, each on
#      its own data directory, and waited for until ready (GET /ready);
#   3. the leader, still of the previous release: `ctl switchover` is
#      refused (0.1.0 has no planned switchover; the refusal is shown), so
#      it is handed over the previous release's way, SIGTERM (a planned
#      hand-over to the caught-up standby), and started on this release;
#   4. every node now runs this release: the cluster's version rises to 3,
#      and `ctl switchover` moves the leader three times without stopping
#      anything;
#   5. the downgrade: the spare goes back to the previous release on the
#      data directory this release wrote (it must open it and join; the
#      cluster's version falls to 2);
#   6. the load stops; it must have seen no wrong page and no client error
#      beyond retried 503s and retried connections, and every acknowledged
#      confirm must be at its page on the final leader.
#
# Prints each step, the write pause around each node change (the longest
# time without an acknowledged confirm) and a verdict; exit 0 when it holds.
#
#   tests/upgrade/rolling.sh      PREV=a53b9bc (the previous release), SYNC=strict
#                                 (--ha-sync), PAGES=65536 (rank 0's and the
#                                 SGLang space's size)
#
# With --ha-sync strict the pause of a switchover includes the new leader's
# snapshot to its new standby (it acknowledges nothing before one is in
# sync), which grows with the state; with available it does not.
#
# The previous release is built once per commit: `git worktree add` of
# PREV under target/upgrade/<commit>/src, `cargo build` (dev profile) into
# target/upgrade/<commit>/build, the binary kept as
# target/upgrade/<commit>/hf3fs-meta; a second run finds the binary and
# builds nothing (the worktree and its build directory are removed once
# the binary is kept). This release: target/debug/hf3fs-meta, built with
# `cargo build --bin hf3fs-meta` (NEW=path to use another). Needs etcd,
# curl and python3. Loopback only; bounded: every wait gives up after 60 s,
# and everything it started is killed and removed on exit.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
PREV="${PREV:-a53b9bc}"
SYNC="${SYNC:-strict}"
export PAGES="${PAGES:-65536}"
COMMIT=$(git rev-parse --verify "$PREV^{commit}")
CACHE="target/upgrade/${COMMIT:0:12}"
OLD="$CACHE/hf3fs-meta"
command -v etcd >/dev/null || { echo "etcd is not installed" >&2; exit 2; }

if [ ! -x "$OLD" ]; then
    echo "== building the previous release ${COMMIT:0:12} (once; cached as $OLD)"
    mkdir -p "$CACHE"
    [ -d "$CACHE/src" ] || git worktree add --detach "$CACHE/src" "$COMMIT" >/dev/null
    (cd "$CACHE/src" && CARGO_TARGET_DIR="$PWD/../build" cargo build --bin hf3fs-meta)
    cp "$CACHE/build/debug/hf3fs-meta" "$OLD.tmp" && mv "$OLD.tmp" "$OLD"
    git worktree remove --force "$CACHE/src"
    rm -rf "$CACHE/build"
else
    echo "== the previous release ${COMMIT:0:12}: cached $OLD"
fi
if [ -z "${NEW:-}" ]; then
    cargo build --bin hf3fs-meta
    NEW=target/debug/hf3fs-meta
fi
echo "== previous: $("$OLD" --version)"
echo "== this:     $("$NEW" --version)"

WORK="$(mktemp -d)"
PIDS=()
cleanup() {
    for f in "$WORK"/*.pid; do [ -f "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
    rm -rf "$WORK"
}
trap cleanup EXIT
# shellcheck source=perf/lib.sh
source perf/lib.sh
etcd_one
EP=$ETCD_URL
TTL=2
declare -A PORT=([a]=$(free_port) [b]=$(free_port) [c]=$(free_port))
declare -A BINOF=()

start_node() { # id binary
    local id=$1 bin=$2
    BINOF[$id]=$bin
    "$bin" --host 127.0.0.1 --port "${PORT[$id]}" --workers 2 --ha etcd --etcd-endpoints "$EP" \
        --ha-cluster /upgrade --node-id "$id" --advertise-url "http://127.0.0.1:${PORT[$id]}" \
        --ha-lease-ttl "$TTL" --ha-token-file "$WORK/token" --data-dir "$WORK/data-$id" --fsync always \
        --ha-sync "$SYNC" >>"$WORK/$id.log" 2>&1 &
    echo $! >"$WORK/$id.pid"
}
stop_node() { # id: SIGTERM, wait for the exit (at most 30 s)
    local id=$1 pid
    pid=$(cat "$WORK/$id.pid")
    kill -TERM "$pid"
    for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    ! kill -0 "$pid" 2>/dev/null || { echo "$id did not stop" >&2; exit 1; }
    rm -f "$WORK/$id.pid"
}
health() { curl -s --max-time 2 "http://127.0.0.1:${PORT[$1]}/health" || true; }
field() { python3 -c "import json,sys
try: v=json.load(sys.stdin)
except Exception: sys.exit(1)
for k in sys.argv[1].split('.'): v = v.get(k) if isinstance(v, dict) else None
print('' if v is None else v)" "$1"; }
wait_until() { # what command...: polls every 0.1 s, at most 60 s
    local what=$1; shift
    for _ in $(seq 600); do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done
    echo "not within 60 s: $what" >&2
    tail -n 30 "$WORK"/*.log >&2 || true
    exit 1
}
ready() { [ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "http://127.0.0.1:${PORT[$1]}/ready")" = 200 ]; }
# The serving leader and its named standby, as the nodes say.
leader() { for id in a b c; do [ "$(health "$id" | field ha.role)" = leader ] && [ "$(health "$id" | field ha.serving)" = True ] && { echo "$id"; return 0; }; done; return 1; }
standby_of() { health "$1" | field ha.standby; }
has_standby() { local l s; l=$(leader) && s=$(standby_of "$l") && [ -n "$s" ] && [ "$s" != "$l" ]; }
old_style_ready() { # the previous release has no /ready: caught up, or serving
    local h; h=$(health "$1"); [ "$(echo "$h" | field ha.role)" = leader ] || [ "$(echo "$h" | field ha.replication.as_standby.caught_up)" = True ] || [ -n "$(echo "$h" | field ha.leader.node)" ]; }
ctl() { "$NEW" ctl "$@" --etcd-endpoints "$EP" --ha-cluster /upgrade; }
now() { date +%s.%N; }
# The longest time without an acknowledged confirm between $1 and $2 (s).
pause() { python3 - "$WORK/writes.log" "$1" "$2" <<'PY'
import sys
log, a, b = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
t = sorted(float(l.split()[0]) for l in open(log) if l.strip())
t = [a] + [x for x in t if a < x < b] + [b]
print(f"{max(y - x for x, y in zip(t, t[1:])) * 1e3:.0f}")
PY
}
acked() { wc -l <"$WORK/writes.log"; }
more_load() { local n; n=$(acked); wait_until "more acknowledged writes" test_more "$n"; }
test_more() { [ "$(acked)" -ge $(($1 + 50)) ]; }
PAUSES=()
note_pause() { # what start
    local p; p=$(pause "$2" "$(now)"); PAUSES+=("$1: ${p} ms"); echo "   write pause around it: ${p} ms"; }

echo "== 1. three nodes of the previous release, a relay, the load"
for id in a b c; do start_node "$id" "$OLD"; done
wait_until "a leader with a standby" has_standby
RP=$(free_port)
"$OLD" relay --listen "127.0.0.1:$RP" --etcd-endpoints "$EP" --ha-cluster /upgrade --ha-lease-ttl "$TTL" \
    >"$WORK/relay.log" 2>&1 &
PIDS+=($!)
wait_until "the relay answers" curl -fs --max-time 2 "http://127.0.0.1:$RP/health"
python3 tests/upgrade/load.py "127.0.0.1:$RP" "$WORK/writes.log" "$WORK/summary.json" 2>"$WORK/load.err" &
LOAD=$!
PIDS+=($LOAD)
touch "$WORK/writes.log"
more_load
L=$(leader); S=$(standby_of "$L"); X=$(echo a b c | tr ' ' '\n' | grep -v -e "^$L$" -e "^$S$")
echo "   leader $L, standby $S, spare $X; $(acked) confirms acknowledged so far"

for role in spare standby; do
    id=$([ $role = spare ] && echo "$X" || echo "$S")
    echo "== 2. the $role $id: stop, start on this release"
    t0=$(now)
    stop_node "$id"
    start_node "$id" "$NEW"
    wait_until "$id ready on this release" ready "$id"
    wait_until "the leader has a standby again" has_standby
    more_load
    echo "   $id: $(health "$id" | field version) ($(health "$id" | field commit)), ready: $(curl -s "http://127.0.0.1:${PORT[$id]}/ready")"
    note_pause "upgrade of the $role $id" "$t0"
done

L=$(leader)
echo "== 3. the leader $L, of the previous release"
if ctl switchover >"$WORK/ctl.out" 2>&1; then echo "ctl switchover worked on the previous release?" >&2; exit 1; fi
echo "   ctl switchover: $(cat "$WORK/ctl.out")"
t0=$(now)
stop_node "$L"
wait_until "another leader" leader
echo "   handed over (SIGTERM) to $(leader)"
start_node "$L" "$NEW"
wait_until "$L ready on this release" ready "$L"
wait_until "a standby named" has_standby
more_load
note_pause "hand-over from and upgrade of the old leader $L" "$t0"

echo "== 4. every node on this release"
ver() { ctl status --json | field version.version; }
ver3() { [ "$(ver)" = 3 ]; }
wait_until "the cluster's version 3" ver3
ctl status
for i in 1 2 3; do
    t0=$(now)
    ctl switchover
    wait_until "a standby named" has_standby
    more_load
    note_pause "ctl switchover $i" "$t0"
done

echo "== 5. the downgrade: the spare goes back to the previous release"
L=$(leader); S=$(standby_of "$L"); X=$(echo a b c | tr ' ' '\n' | grep -v -e "^$L$" -e "^$S$")
grep -q "written_by" "$WORK/data-$X/FORMAT"
t0=$(now)
stop_node "$X"
start_node "$X" "$OLD"
wait_until "$X (previous release) follows the leader" old_style_ready "$X"
ver2() { [ "$(ver)" = 2 ]; }
wait_until "the cluster's version back to 2" ver2
more_load
echo "   $X: $(health "$X" | field status) on $("$OLD" --version); cluster version $(ver)"
note_pause "downgrade of the spare $X" "$t0"
ctl status

echo "== 6. the load stops; the check"
kill -TERM "$LOAD"
wait "$LOAD" || true
L=$(leader)
python3 - "$WORK/summary.json" "127.0.0.1:${PORT[$L]}" <<'PY'
import http.client, json, sys
s = json.load(open(sys.argv[1]))
host, port = sys.argv[2].rsplit(":", 1)
def post(path, body):
    c = http.client.HTTPConnection(host, int(port), timeout=30)
    c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    return json.loads(r.read())
lost = []
for dialect in ("vllm", "sglang"):
    items = [(k, p) for d, k, p in s["acked"] if d == dialect]
    for i in range(0, len(items), 512):
        chunk = items[i:i + 512]
        keys = [k for k, _ in chunk]
        if dialect == "vllm":
            got = post("/keys/get_locations", {"rank": 0, "keys": keys})["locations"]
        else:
            got = post("/0/get_page_indices", {"keys": keys})["indices"]
        lost += [f"{dialect} {k}: acknowledged at {p}, now {g}" for (k, p), g in zip(chunk, got) if g != p]
print(f"   {s['confirms']} confirms acknowledged ({s['acked_keys']} keys), {s['loads']} loads checked")
print(f"   wrong pages read: {s['wrong_page_count']}; client errors: {s['error_count']}; retried 503s: {s['retried_503']}; retried connections: {s['retried_conn']}")
print(f"   acknowledged confirms not at their page on the final leader: {len(lost)}")
for x in (s["wrong_pages"] + s["errors"] + lost)[:10]:
    print("   ", x)
sys.exit(0 if not lost and s["wrong_page_count"] == 0 and s["error_count"] == 0 else 1)
PY
ok=$?
echo "== write pauses"
printf '   %s\n' "${PAUSES[@]}"
[ "$ok" = 0 ] && echo "== PASS: no acknowledged confirm lost, no wrong page, no client error beyond retried 503s"
exit "$ok"
