#!/usr/bin/env bash
# RUSTC_WRAPPER for the loom build (see docs/verification.md).
#
# `RUSTFLAGS="--cfg loom"` reaches every crate, and tokio compiles itself
# without `tokio::net` under `cfg(loom)` (its own loom test mode), which the
# HTTP server needs. This wrapper drops `--cfg loom` from tokio's compilation
# only; every other crate (hf3fs-meta above all) still sees it, and cargo still
# resolves the `[target.'cfg(loom)'.dependencies]` (loom) as usual.
rustc="$1"
shift
args=("$@")
crate=""
for ((i = 0; i < ${#args[@]}; i++)); do
    if [[ "${args[$i]}" == "--crate-name" ]]; then
        crate="${args[$((i + 1))]}"
        break
    fi
done
if [[ "$crate" == "tokio" ]]; then
    out=()
    for ((i = 0; i < ${#args[@]}; i++)); do
        if [[ "${args[$i]}" == "--cfg" && "${args[$((i + 1))]}" == "loom" ]]; then
            i=$((i + 1))
            continue
        fi
        out+=("${args[$i]}")
    done
    args=("${out[@]}")
fi
exec "$rustc" "${args[@]}"
