# perf/ha_etcd.sh — sourced (not run) by the HA benchmarks (perf/ha_failover.sh,
# perf/replication.sh, perf/replication_instructions.sh): the part of their
# set-up they share. `free_port` prints a free loopback port; `etcd_one`
# starts one etcd member on loopback in $WORK/etcd with fast elections
# (heartbeat 50 ms, election 500 ms), adds its pid to PIDS (the caller's
# cleanup stops it), waits until it is healthy (at most 10 s), writes the
# cluster secret to $WORK/token and sets ETCD_URL. Needs WORK and PIDS.

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

etcd_one() {
  local client peer
  client=$(free_port) peer=$(free_port)
  etcd --name m0 --data-dir "$WORK/etcd" --listen-client-urls "http://127.0.0.1:$client" \
    --advertise-client-urls "http://127.0.0.1:$client" --listen-peer-urls "http://127.0.0.1:$peer" \
    --initial-advertise-peer-urls "http://127.0.0.1:$peer" --initial-cluster "m0=http://127.0.0.1:$peer" \
    --heartbeat-interval 50 --election-timeout 500 --log-level error >"$WORK/etcd.log" 2>&1 &
  PIDS+=($!)
  ETCD_URL="http://127.0.0.1:$client"
  for _ in $(seq 200); do curl -fs "$ETCD_URL/health" >/dev/null 2>&1 && break; sleep 0.05; done
  echo "a-cluster-secret-of-32-characters" >"$WORK/token"
}
