#!/usr/bin/env bash
# Build the tests' franka_msgs / control_msgs subsets (tests/robot/ros_interfaces) into a venv
# that has the `ros` and `ros-build` extras, as a ROS workspace would install them: Python
# modules in site-packages, libraries in <venv>/lib (where the ROS wheels put theirs), ament
# index in <venv>/share. Idempotent: a stamp holds the hash of the definitions built.
#
#   bash scripts/build_ros_test_interfaces.sh [venv]      (scripts/setup.sh calls it)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${1:-${VLA_VENV:-$ROOT/.venv}}"
SRC="$ROOT/tests/robot/ros_interfaces"
STAMP="$VENV/.vla-ros-interfaces-stamp"
log() { printf '[ros-interfaces] %s\n' "$*" >&2; }

HASH="$(cd "$SRC" && find . -type f ! -name '*.md' | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-16)"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$HASH" ]; then
  exit 0
fi

# a C/C++ toolchain and cmake (Debian: cmake g++ make), and this Python's headers
missing=()
for tool in cmake make cc c++; do command -v "$tool" >/dev/null 2>&1 || missing+=("$tool"); done
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    log "installing cmake and a C++ compiler (apt) for: ${missing[*]}"
    { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y cmake g++ make; } >"$ROOT/.setup-apt.log" 2>&1 \
      || { cat "$ROOT/.setup-apt.log" >&2; log "apt failed (log above)"; exit 1; }
  else
    log "building the test ROS interfaces needs ${missing[*]}: install cmake, g++ and make (Debian: apt-get install cmake g++ make)"
    exit 1
  fi
fi
if ! "$VENV/bin/python" -c "import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()['include'], 'Python.h')))"; then
  log "building the test ROS interfaces needs this Python's headers (Python.h): install python3-dev for $("$VENV/bin/python" -c 'import sys; print(sys.version.split()[0])')"
  exit 1
fi

BUILD="$(mktemp -d)"
trap 'rm -rf "$BUILD"' EXIT
LOG="$VENV/.vla-ros-interfaces-build.log"
: > "$LOG"
for pkg in franka_msgs control_msgs; do
  log "building $pkg (the tests' subset) into $VENV"
  if ! { PATH="$VENV/bin:$PATH" cmake -S "$SRC/$pkg" -B "$BUILD/$pkg" -DCMAKE_PREFIX_PATH="$VENV" \
           -DCMAKE_INSTALL_PREFIX="$VENV" -DPython3_EXECUTABLE="$VENV/bin/python" -DBUILD_TESTING=OFF \
         && PATH="$VENV/bin:$PATH" cmake --build "$BUILD/$pkg" -j "$(nproc)" \
         && cmake --install "$BUILD/$pkg"; } >>"$LOG" 2>&1; then
    tail -40 "$LOG" >&2
    log "building $pkg failed (the last lines above; the whole log: $LOG)"
    exit 1
  fi
done
echo "$HASH" > "$STAMP"
