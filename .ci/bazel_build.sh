#!/usr/bin/env bash
# Builds tfring's op library with Bazel, offline, and copies it to $1
# (default: build/bazel/_tfring_ops.so).
#
#   .ci/bazel_build.sh [OUTPUT.so]
#
# Run it inside the Python environment that has tensorflow, pybind11 and mpich
# (or set PYTHON_BIN_PATH): //third_party:tf_configure.bzl asks that
# interpreter where TF, pybind11, Python.h and MPI are.
#
# Bazel binary: $BAZEL if set; otherwise Debian's `bazel-4` (bazel-bootstrap)
# when installed, else `bazel`. Debian's /usr/bin/bazel is a wrapper that
# honours .bazelversion and would look for a bazel-6.5.0 binary; `bazel-4`
# bypasses it. Bazel 4 / version-less builds get --config=offline (see
# .bazelrc); set BAZEL_OFFLINE=0/1 to override.
#
# Other knobs: BAZEL_JOBS (default 2), BAZEL_RAM_MB (default 4096),
# BAZEL_DISK_CACHE (Bazel's --disk_cache, default ~/.cache/tfring-bazel: a
# rebuild of unchanged sources reuses every action; "" turns it off),
# BAZEL_EXTRA_ARGS (appended to `bazel build`).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-build/bazel/_tfring_ops.so}"
case "$OUT" in
  /*) ;;
  *) OUT="$PWD/$OUT" ;;
esac

if [[ -z "${BAZEL:-}" ]]; then
  if command -v bazel-4 >/dev/null 2>&1; then
    BAZEL=bazel-4
  elif command -v bazel >/dev/null 2>&1; then
    BAZEL=bazel
  else
    echo "bazel_build.sh: no bazel found (apt-get install bazel-bootstrap, or install bazelisk)" >&2
    exit 2
  fi
fi

if [[ -z "${PYTHON_BIN_PATH:-}" ]]; then
  PYTHON_BIN_PATH="$(command -v python3 || command -v python || true)"
fi
if [[ -z "$PYTHON_BIN_PATH" ]]; then
  echo "bazel_build.sh: no python3 on PATH; set PYTHON_BIN_PATH" >&2
  exit 2
fi
export PYTHON_BIN_PATH

if [[ -z "${BAZEL_OFFLINE:-}" ]]; then
  # Debian's bazel-bootstrap reports "bazel no_version".
  version="$("$BAZEL" --version 2>/dev/null || true)"
  case "$version" in
    "bazel no_version"* | "bazel 4."* | "bazel " | "") BAZEL_OFFLINE=1 ;;
    *) BAZEL_OFFLINE=0 ;;
  esac
fi

args=(
  build
  --jobs="${BAZEL_JOBS:-2}"
  --local_ram_resources="${BAZEL_RAM_MB:-4096}"
)
if [[ "$BAZEL_OFFLINE" == 1 ]]; then
  args+=(--config=offline)
fi
disk_cache="${BAZEL_DISK_CACHE-$HOME/.cache/tfring-bazel}"
if [[ -n "$disk_cache" ]]; then
  args+=(--disk_cache="$disk_cache")
fi
# shellcheck disable=SC2206
args+=(${BAZEL_EXTRA_ARGS:-} //tf_ops:tfring_ops)

cd "$ROOT"
echo "+ $BAZEL ${args[*]}  (PYTHON_BIN_PATH=$PYTHON_BIN_PATH)" >&2
start=$(date +%s)
"$BAZEL" "${args[@]}"
bin_dir="$("$BAZEL" info "${args[@]:1:$((${#args[@]} - 2))}" bazel-bin 2>/dev/null)"
built="$bin_dir/tf_ops/_tfring_ops.so"
if [[ ! -f "$built" ]]; then
  echo "bazel_build.sh: expected $built after the build" >&2
  exit 1
fi

mkdir -p "$(dirname "$OUT")"
rm -f "$OUT"
cp "$built" "$OUT"
chmod u+w "$OUT"  # Bazel outputs are read-only.
echo "bazel_build.sh: built $OUT in $(($(date +%s) - start)) s" >&2
