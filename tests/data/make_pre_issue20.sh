#!/bin/sh
# Builds a data directory of this folder with a release of this repository:
# BIN (default ./target/debug/hf3fs-meta) and NAME name it; run from the
# repository root. The same requests for every release.
#   tests/data/make_pre_issue20.sh TERM   -> tests/data/pre-issue20-sigterm (the release before journaled reservations, main at 49da9ce)
#   tests/data/make_pre_issue20.sh KILL   -> tests/data/pre-issue20-sigkill
#   BIN=target/upgrade/a53b9bcaf524/hf3fs-meta NAME=release-0.1.0 tests/data/make_pre_issue20.sh TERM
#                                         -> tests/data/release-0.1.0-sigterm (0.1.0, a53b9bc: format 2)
set -eu
sig=$1
name=$(echo "$sig" | tr 'A-Z' 'a-z')
dir=tests/data/${NAME:-pre-issue20}-sig$name
rm -rf "$dir"
port=18731
"${BIN:-./target/debug/hf3fs-meta}" --host 127.0.0.1 --port $port --data-dir "$dir" \
  --fsync always --log-level warn &
pid=$!
u=http://127.0.0.1:$port
until curl -sf $u/health >/dev/null; do :; done
post() { curl -sf -X POST -H 'content-type: application/json' "$u$1" -d "$2"; echo; }
k() { printf '%032x' "$1"; }
post /rank/0/initialize '{"num_pages":16}'
post /rank/1/initialize '{"num_pages":8}'
# rank 0: keys 1..5 allocated; 1..3 confirmed, 4 released, 5 left reserved.
post /keys/batch_allocate "{\"rank\":0,\"keys\":[\"$(k 1)\",\"$(k 2)\",\"$(k 3)\",\"$(k 4)\",\"$(k 5)\"]}"
post /keys/confirm_write "{\"rank\":0,\"confirmations\":[[\"$(k 1)\",0],[\"$(k 2)\",1],[\"$(k 3)\",2]],\"pages_to_release\":[3]}"
# rank 1: key 1 stored, then key 6 stored and released again (a bound release).
post /keys/batch_allocate "{\"rank\":1,\"keys\":[\"$(k 1)\",\"$(k 6)\"]}"
post /keys/confirm_write "{\"rank\":1,\"confirmations\":[[\"$(k 1)\",0],[\"$(k 6)\",1]]}"
post /keys/confirm_write "{\"rank\":1,\"pages_to_release\":[1]}"
# SGLang: space (0, kv) of 8 pages; a, b stored, c reserved, b deleted.
post /0/initialize '{"num_pages":8}'
post /0/reserve_and_allocate_page_indices '{"keys":[["a",""],["b",""],["c",""]]}'
post /0/confirm_write '{"written_keys_to_confirm":[["a",0],["b",1]],"pages_to_release":[]}'
post /0/delete_keys '{"keys":["b"]}'
post /0/initialize '{"num_pages":4,"namespace":"mamba"}'
post /0/reserve_and_allocate_page_indices '{"namespace":"mamba","keys":["m1"]}'
post /0/confirm_write '{"namespace":"mamba","written_keys_to_confirm":[["m1",0]]}'
kill -$sig $pid
wait $pid || true
rm -f "$dir/LOCK"
