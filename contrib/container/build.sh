#!/usr/bin/env bash
# Builds the container image localhost/hf3fs-meta:<version> and :latest
# (contrib/container/Containerfile) with podman, or buildah when podman is
# not installed.
#
#   contrib/container/build.sh                      # cargo build --release first
#   contrib/container/build.sh --binary target/ci/hf3fs-meta
#   HF3FS_META_BINARY=target/ci/hf3fs-meta contrib/container/build.sh
#
# Options: --binary PATH (or HF3FS_META_BINARY): a binary built already, not
# rebuilt; --tool podman|buildah (or HF3FS_META_CONTAINER_TOOL); --image NAME
# (default localhost/hf3fs-meta); --source URL (the
# org.opencontainers.image.source label; default: git's origin URL).
#
# The tag is the version the binary prints (`hf3fs-meta --version`), which
# must equal Cargo.toml's; the revision label is the binary's commit. The
# image holds the binary, the shared libraries `ldd` names (copied from this
# machine, so build on the distribution the binary was built on), a passwd
# entry for uid 10001, an empty /tmp and the data directory. The last line
# printed is the image reference it tagged.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
ROOT="$PWD"
BIN="${HF3FS_META_BINARY:-}"
TOOL="${HF3FS_META_CONTAINER_TOOL:-}"
IMAGE="localhost/hf3fs-meta"
SOURCE="$(git config --get remote.origin.url 2>/dev/null || true)"
while [ $# -gt 0 ]; do
    case "$1" in
    --binary) BIN="$2"; shift 2 ;;
    --tool) TOOL="$2"; shift 2 ;;
    --image) IMAGE="$2"; shift 2 ;;
    --source) SOURCE="$2"; shift 2 ;;
    -h | --help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build.sh: unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
done
fail() { echo "build.sh: $*" >&2; exit 1; }

if [ -z "$TOOL" ]; then
    if command -v podman >/dev/null; then TOOL=podman
    elif command -v buildah >/dev/null; then TOOL=buildah
    else fail "neither podman nor buildah is installed (Debian: apt-get install podman, or buildah)"
    fi
fi
case "$TOOL" in podman | buildah) ;; *) fail "--tool: podman or buildah, not $TOOL" ;; esac

if [ -z "$BIN" ]; then
    cargo build --release --locked --bin hf3fs-meta
    BIN="$ROOT/target/release/hf3fs-meta"
fi
[ -x "$BIN" ] || fail "$BIN: no such executable"

# hf3fs-meta 0.2.0 (commit 402dbe2bd6d5; replication protocol 2-3; ...)
version_line="$("$BIN" --version)"
VERSION="$(awk '{print $2}' <<<"$version_line")"
REVISION="$(sed -n 's/.*(commit \([0-9a-f]*\).*/\1/p' <<<"$version_line")"
CARGO_VERSION="$(sed -n '/^\[package\]/,/^\[/ s/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)"
[ "$VERSION" = "$CARGO_VERSION" ] ||
    fail "$BIN --version says $VERSION, Cargo.toml $CARGO_VERSION: rebuild it (or drop --binary)"
# The full commit when the binary's is this checkout's.
if full="$(git rev-parse HEAD 2>/dev/null)" && [ -n "$REVISION" ] && [ "${full#"$REVISION"}" != "$full" ]; then
    REVISION="$full"
fi

CTX="$(mktemp -d)"
trap 'rm -rf "$CTX"' EXIT
R="$CTX/rootfs"
mkdir -p "$R/usr/local/bin" "$R/etc" "$R/tmp" "$CTX/data"
chmod 1777 "$R/tmp"
install -m 0755 "$BIN" "$R/usr/local/bin/hf3fs-meta"
# Every library the dynamic loader resolves, the loader included, at the
# path it is resolved at (a static binary has none: ldd says so, no copy).
libs="$(ldd "$BIN" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' | sort -u)" || true
for lib in $libs; do
    mkdir -p "$R$(dirname "$lib")"
    cp -L "$lib" "$R$lib"
done
if [ -z "$libs" ] && ! ldd "$BIN" 2>&1 | grep -q 'not a dynamic executable\|statically linked'; then
    fail "ldd $BIN named no library and does not call it static"
fi
printf 'root:x:0:0:root:/nonexistent:/sbin/nologin\nhf3fs-meta:x:10001:10001:hf3fs-meta:/var/lib/hf3fs-meta:/sbin/nologin\n' >"$R/etc/passwd"
printf 'root:x:0:\nhf3fs-meta:x:10001:\n' >"$R/etc/group"

CREATED="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
args=(--format docker --layers=false -f "$ROOT/contrib/container/Containerfile"
    --build-arg "VERSION=$VERSION" --build-arg "REVISION=$REVISION"
    --build-arg "CREATED=$CREATED" --build-arg "SOURCE=$SOURCE"
    -t "$IMAGE:$VERSION" -t "$IMAGE:latest")
if [ "$TOOL" = podman ]; then
    podman build "${args[@]}" "$CTX" >&2
else
    buildah bud "${args[@]}" "$CTX" >&2
fi
echo "$IMAGE:$VERSION"
