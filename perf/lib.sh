# perf/lib.sh — sourced (not run) by the perf/ scripts, from the repository
# root (`source perf/lib.sh`, after the script's `cd` there): the set-up they
# share, so that each of them finds ports, binaries and etcd the same way.
# It defines functions only (and PERF_NAME); it starts nothing by itself and
# changes no shell option.
#
#   log MSG...               one line "NAME: MSG" on stderr
#   free_port                a free loopback port, chosen by the kernel
#   free_port_below_ephemeral  a free loopback port below the ephemeral range
#   wait_port PORT           until something listens on 127.0.0.1:PORT (≤ 10 s)
#   perf_bin_dir PROFILE     the directory cargo puts PROFILE's binaries in
#   perf_build PROFILE ARGS  cargo build --profile PROFILE ARGS
#   etcd_one                 one throwaway etcd member on loopback (needs WORK, PIDS)

# The name `log` prints before each line: the running script's file name,
# unless the script set PERF_NAME before sourcing this file.
PERF_NAME=${PERF_NAME:-$(basename "$0")}

# log MSG...: print "PERF_NAME: MSG" on stderr (stdout stays for results).
log() { echo "$PERF_NAME: $*" >&2; }

# free_port: print a loopback port that is free now, as the kernel picks one
# for a bind to port 0 (so it lies in the ephemeral range). Another process
# may take it before the caller binds it; the scripts bind it at once.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# free_port_below_ephemeral: print a free loopback port in 10000..(start of
# the kernel's ephemeral range), picked at random and checked with `ss` and a
# connect. For a target whose load generator opens thousands of client
# sockets: a port that one of them holds (ephemeral ones) cannot be bound.
# Gives up (log + exit 1) after 200 tries.
free_port_below_ephemeral() {
  local lo=10000 span ephemeral_lo p
  ephemeral_lo=$(awk '{ print $1 }' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
  span=$(( ephemeral_lo > 12000 ? ephemeral_lo - lo : 20000 ))
  for _ in $(seq 1 200); do
    p=$(( lo + RANDOM % span ))
    if [[ -z "$(ss -Htln "sport = :$p" 2>/dev/null)" ]] && ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      echo "$p"; return 0
    fi
  done
  log "no free port found"; exit 1
}

# wait_port PORT: return 0 as soon as a TCP connect to 127.0.0.1:PORT
# succeeds, polled every 50 ms; return 1 after 200 tries (10 s).
wait_port() {
  for _ in $(seq 200); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.05
  done
  return 1
}

# perf_bin_dir PROFILE: print where `cargo build --profile PROFILE` puts its
# binaries: $CARGO_TARGET_DIR (default target/ under the current directory,
# the repository root) / PROFILE, with cargo's one exception: dev → debug.
perf_bin_dir() {
  local dir=${CARGO_TARGET_DIR:-$PWD/target}
  if [[ $1 == dev ]]; then echo "$dir/debug"; else echo "$dir/$1"; fi
}

# perf_build PROFILE ARGS...: `cargo build --profile PROFILE ARGS...` (e.g.
# `perf_build ci -p hf3fs-soak --bin soak`); the caller redirects its output.
# Profiles (Cargo.toml): release (fat LTO) for throughput figures, ci for
# the CI gates (instruction counts, the soak), dev for debugging.
perf_build() {
  local profile=$1; shift
  cargo build --profile "$profile" "$@"
}

# etcd_one: start one etcd member on loopback in $WORK/etcd with fast
# elections (heartbeat 50 ms, election 500 ms), its log in $WORK/etcd.log;
# add its pid to PIDS (the caller's cleanup stops it), wait until it is
# healthy (at most 10 s), write the cluster secret to $WORK/token and set
# ETCD_URL. Needs WORK and PIDS.
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
