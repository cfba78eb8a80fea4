#!/usr/bin/env bash
# One-shot, idempotent setup: system packages (as root), a venv in .venv, the project
# with the requested extras. Re-running with nothing changed, or asking for extras an earlier run
# installed with others, takes well under a second. With the `robot` extra it also makes
# .venv-franky-sim (VLA_FRANKY_SIM_VENV), the simulated Franka server the robot tests talk to.
#
#   bash scripts/setup.sh [extras]     e.g. bash scripts/setup.sh maniskill,dev
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
EXTRAS="${1:-maniskill}"
VENV="${VLA_VENV:-$ROOT/.venv}"
FRANKY_SIM_VENV="${VLA_FRANKY_SIM_VENV:-$ROOT/.venv-franky-sim}"
FRANKY_SIM_SPEC="franky-sim==1.0.4"
PY="${PYTHON:-python3}"
TORCH_VERSION="2.13.0"   # the CPU wheel; installing torch first keeps pip from pulling a CUDA build

log() { printf '[setup] %s\n' "$*" >&2; }

# --- system packages ---------------------------------------------------------------
# SAPIEN (ManiSkill's renderer) needs a Vulkan device even without a GPU. Debian 12's
# lavapipe (Mesa 22) is rejected by SAPIEN; Mesa >= 23 from bookworm-backports works.
need_system_packages() {
  local need=0
  [ -e /usr/share/vulkan/icd.d/lvp_icd.x86_64.json ] || [ -e /usr/share/vulkan/icd.d/lvp_icd.json ] || need=1
  ldconfig -p 2>/dev/null | grep -q 'libvulkan.so.1' || need=1
  if [ -r /etc/os-release ] && grep -q 'VERSION_CODENAME=bookworm' /etc/os-release; then
    local mesa
    mesa="$(dpkg-query -W -f='${Version}' mesa-vulkan-drivers 2>/dev/null || true)"
    case "$mesa" in ""|22.*) need=1 ;; esac
  fi
  return $((1 - need))
}

APT_CMDS_BOOKWORM='cat > /etc/apt/sources.list.d/bookworm-backports.sources <<SRC
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
apt-get update && apt-get install -y -t bookworm-backports mesa-vulkan-drivers libvulkan1 && apt-get install -y libusb-1.0-0 libegl1'
APT_CMDS_OTHER='apt-get update && apt-get install -y mesa-vulkan-drivers libvulkan1 libusb-1.0-0 libegl1'

if command -v apt-get >/dev/null 2>&1 && need_system_packages; then
  if grep -q 'VERSION_CODENAME=bookworm' /etc/os-release 2>/dev/null; then CMDS="$APT_CMDS_BOOKWORM"; else CMDS="$APT_CMDS_OTHER"; fi
  if [ "$(id -u)" = "0" ]; then
    log "installing the Vulkan loader and a lavapipe new enough for SAPIEN (apt)"
    export DEBIAN_FRONTEND=noninteractive
    bash -c "$CMDS" >"$ROOT/.setup-apt.log" 2>&1 || { cat "$ROOT/.setup-apt.log" >&2; log "apt failed (log above)"; exit 1; }
  else
    log "not root: ManiSkill rendering needs Mesa >= 23 lavapipe and libvulkan1. Run as root:"
    printf '%s\n' "$CMDS" >&2
  fi
fi

# --- python environment -----------------------------------------------------------
STAMP="$VENV/.vla-setup-stamp"
HASH="$(sha256sum < "$ROOT/pyproject.toml" | cut -c1-16)"
WANT="$HASH $EXTRAS"
# Done already if one install of this pyproject.toml had every extra asked for now (the test
# suite's maniskill,libero,dev covers the main job's maniskill).
installed_all() {
  [ -f "$STAMP" ] || return 1
  local line have extra
  while read -r line; do
    [ "${line%% *}" = "$HASH" ] || continue
    have=",${line#* },"
    for extra in ${EXTRAS//,/ }; do
      case "$have" in *",$extra,"*) ;; *) continue 2 ;; esac
    done
    return 0
  done < "$STAMP"
  return 1
}
# Some pip.conf files name local indexes that may be absent; their warnings are noise.
pip_quiet() {
  "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" >&2 || true; }
  return "${PIPESTATUS[0]}"
}

# franky-sim (a MuJoCo Franka speaking libfranka's network protocol) needs numpy >= 2 (through
# pin 3/4) and mujoco >= 3.2, while the project pins numpy < 2 and LIBERO mujoco 2.3.7: it gets
# its own venv and runs as a server process that franky in .venv connects to over loopback.
setup_franky_sim() {
  case ",$EXTRAS," in *,robot,*) ;; *) return 0 ;; esac
  local stamp="$FRANKY_SIM_VENV/.vla-setup-stamp"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$FRANKY_SIM_SPEC" ]; then
    return 0
  fi
  if [ ! -x "$FRANKY_SIM_VENV/bin/python" ]; then
    log "creating $FRANKY_SIM_VENV (the franky-sim server)"
    "$PY" -m venv "$FRANKY_SIM_VENV"
  fi
  log "installing $FRANKY_SIM_SPEC into $FRANKY_SIM_VENV"
  local sim_pip=(pip_quiet "$FRANKY_SIM_VENV/bin/python" -m pip --disable-pip-version-check -q)
  "${sim_pip[@]}" install -U pip
  "${sim_pip[@]}" install "$FRANKY_SIM_SPEC"
  echo "$FRANKY_SIM_SPEC" > "$stamp"
}

# The tests' franka_msgs / control_msgs (not on PyPI), built with the ros-build extra's tools.
setup_ros_test_interfaces() {
  case ",$EXTRAS," in *,ros-build,*) bash "$ROOT/scripts/build_ros_test_interfaces.sh" "$VENV" ;; esac
}

if installed_all; then
  setup_franky_sim
  setup_ros_test_interfaces
  exit 0
fi
if [ ! -x "$VENV/bin/python" ]; then
  log "creating $VENV"
  "$PY" -m venv "$VENV"
fi
PIP=(pip_quiet "$VENV/bin/python" -m pip --disable-pip-version-check -q)
if ! "$VENV/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH_VERSION')" 2>/dev/null; then
  log "installing torch $TORCH_VERSION (CPU)"
  "${PIP[@]}" install "torch==$TORCH_VERSION"
fi
log "installing the project with extras [$EXTRAS]"
"${PIP[@]}" install -e "$ROOT[$EXTRAS]"
echo "$WANT" >> "$STAMP"
setup_franky_sim
setup_ros_test_interfaces
log "ready: $VENV"
