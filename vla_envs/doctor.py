"""``vla-envs doctor``: what this machine can run, in seconds, with the exact fix for what is missing.

Rendering and GPU setup otherwise fail deep inside a worker process (a Vulkan ICD, the EGL vendor,
``libcuda.so``, the PhysX GPU library, an asset pack). Each probe runs in its own subprocess with a
timeout, so a driver that hangs or crashes cannot take the report with it.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from dataclasses import dataclass

PROBE_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Check:
    name: str
    status: str
    """``ok``, ``missing`` (needed by something installed here) or ``absent`` (optional, not here)."""
    detail: str
    fix: str = ""


def _probe(code: str, timeout_s: float = PROBE_TIMEOUT_S, env: dict | None = None) -> tuple[bool, str]:
    """Run ``code`` in a fresh interpreter; (exit 0, its last output line or error)."""
    import os

    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout_s,
                             env={**os.environ, **(env or {})})
    except subprocess.TimeoutExpired:
        return False, f"no answer within {timeout_s:g} s"
    lines = (out.stdout if out.returncode == 0 else out.stderr).strip().splitlines()
    return out.returncode == 0, lines[-1] if lines else f"exit status {out.returncode}"


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def check_vulkan() -> Check:
    if not _installed("sapien"):
        return Check("Vulkan (SAPIEN, ManiSkill)", "absent", "sapien is not installed",
                     "bash scripts/setup.sh maniskill")
    ok, out = _probe("import sapien; s = sapien.render.get_device_summary(); "
                     "print(' / '.join(l.strip() for l in s.splitlines() if l.startswith('GPU') or 'cuda' in l.lower()))")
    if ok and "GPU:" in out:
        return Check("Vulkan (SAPIEN, ManiSkill)", "ok", out)
    return Check("Vulkan (SAPIEN, ManiSkill)", "missing", out or "no Vulkan device",
                 "a Vulkan driver: the GPU's (NVIDIA: the driver's Vulkan ICD, libnvidia-gl) or Mesa >= 23 lavapipe "
                 "(Debian 12: apt-get install -t bookworm-backports mesa-vulkan-drivers libvulkan1)")


def check_egl() -> Check:
    """The backend LIBERO will use: the user's ``MUJOCO_GL`` when set, else the first that renders."""
    if not _installed("mujoco"):
        return Check("EGL / OSMesa (MuJoCo, LIBERO)", "absent", "mujoco is not installed", "bash scripts/setup.sh libero")

    from vla_envs.backends.libero.rendering import CANDIDATES, find_gl

    backend, errors, user_set = find_gl()
    if user_set:
        if backend is not None:
            return Check("EGL / OSMesa (MuJoCo, LIBERO)", "ok", f"MUJOCO_GL={backend} (set in the environment) renders")
        chosen, err = next(iter(errors.items()))
        return Check("EGL / OSMesa (MuJoCo, LIBERO)", "missing", f"MUJOCO_GL={chosen} is set but fails: {err}",
                     f"unset MUJOCO_GL (LIBERO then picks {' or '.join(CANDIDATES)}) or set one that renders")
    if backend is not None:
        return Check("EGL / OSMesa (MuJoCo, LIBERO)", "ok", f"MUJOCO_GL={backend} renders")
    return Check("EGL / OSMesa (MuJoCo, LIBERO)", "missing", "; ".join(f"{k}: {v}" for k, v in errors.items()),
                 "apt-get install libegl1 (or libosmesa6 and MUJOCO_GL=osmesa)")


def check_cuda() -> Check:
    import ctypes.util

    ok, out = _probe("import torch; print(torch.cuda.is_available(), torch.version.cuda, "
                     "torch.cuda.device_count() and torch.cuda.get_device_name(0))")
    lib = ctypes.util.find_library("cuda")
    if ok and out.startswith("True"):
        return Check("CUDA", "ok", f"torch sees it ({out}); libcuda: {lib}")
    return Check("CUDA", "absent", f"torch: {out}; libcuda.so: {lib or 'not found'}",
                 "only for GPU physics and GPU training: an NVIDIA driver and a CUDA build of torch")


def check_physx(cuda: bool = False) -> Check:
    """The PhysX GPU library: missing where CUDA is (sim_backend='auto' picks 'physx_cuda' there),
    absent (optional) elsewhere."""
    if not _installed("sapien"):
        return Check("PhysX GPU library", "absent", "sapien is not installed", "bash scripts/setup.sh maniskill")
    from vla_envs.backends.maniskill.physx import physx_library_status

    present, path = physx_library_status()
    if present:
        return Check("PhysX GPU library", "ok", str(path))
    what = "is truncated" if path.is_file() else "is missing"
    needed = ("sim_backend='auto' picks 'physx_cuda' on this CUDA machine" if cuda
              else "needed only for sim_backend='physx_cuda'")
    return Check("PhysX GPU library", "missing" if cuda else "absent", f"{path} {what} ({needed})",
                 "vla-envs fetch-physx (on a machine with internet; --home DIR for a shared disk)")


def check_assets() -> list[Check]:
    from vla_envs.registry import TASKS

    checks = []
    first: dict = {}  # each suite's first id stands for it (PutOnPlate: Main-v3)
    for s in TASKS.values():
        if s.backend != "franka":
            first.setdefault(s.suite.split("/")[0], s)
    for suite, spec in first.items():
        if not spec.backend_installed():
            checks.append(Check(f"assets: {suite}", "absent", f"the {spec.backend} backend is not installed",
                                f"pip install 'vla-rl[{spec.extra}]'"))
            continue
        try:
            status = spec.assets_status()
        except Exception as e:  # noqa: BLE001  a broken pack must show up here, not stop the report
            status = f"error: {e}"
        good = status == "present" or status.startswith(("official", "procedural"))
        checks.append(Check(f"assets: {suite} ({spec.id})", "ok" if good else "missing", status,
                            "" if good else "vla-envs fetch-assets (PutOnPlate), or see the error"))
    return checks


def check_robot() -> list[Check]:
    from pathlib import Path

    checks = []
    for module, what, extra in (("franky", "franky (Franka arm)", "robot"), ("pyrealsense2", "pyrealsense2 (RealSense)",
                                                                           "robot"), ("cv2", "OpenCV", "robot"),
                                ("rclpy", "rclpy (ROS 2)", "ros")):
        if not _installed(module):
            checks.append(Check(what, "absent", "not installed", f"pip install 'vla-rl[{extra}]'"))
            continue
        ok, out = _probe(f"import {module}; print(getattr({module}, '__version__', 'importable'))", timeout_s=30)
        checks.append(Check(what, "ok" if ok else "missing", out, "" if ok else f"reinstall: pip install 'vla-rl[{extra}]'"))
    if _installed("rclpy"):
        # RosArm's default gripper and error recovery use franka_msgs, its gripper_command control_msgs:
        # neither is on PyPI, a robot PC has them from its ROS workspace
        found = {m: _installed(m) for m in ("franka_msgs", "control_msgs")}
        checks.append(Check("ROS arm messages (franka_msgs, control_msgs)", "ok" if all(found.values()) else "absent",
                            ", ".join(f"{m}: {'importable' if ok else 'not found'}" for m, ok in found.items()),
                            "" if all(found.values()) else "source the robot PC's ROS workspace, or set the ROS arm's "
                            "gripper: set_bool / none and error_recovery_action: ''"))
    if _installed("franky"):
        # where scripts/setup.sh puts it (the tests read the same variable)
        venv = os.environ.get("VLA_FRANKY_SIM_VENV") or Path(__file__).resolve().parents[1] / ".venv-franky-sim"
        sim = Path(venv) / "bin" / "franky-sim"
        checks.append(Check("franky-sim (simulated arm for tests)", "ok" if sim.exists() else "absent", str(sim),
                            "" if sim.exists() else "bash scripts/setup.sh maniskill,libero,dev,robot"))
    return checks


def run_checks() -> list[Check]:
    cuda = check_cuda()
    return [check_vulkan(), check_egl(), cuda, check_physx(cuda=cuda.status == "ok"), *check_assets(), *check_robot()]


def report(checks: list[Check]) -> str:
    import textwrap

    rows = [("check", "status", "detail", "fix")] + [(c.name, c.status, c.detail, c.fix) for c in checks]
    widths = [min(max(len(r[i]) for r in rows), 60) for i in range(3)]
    lines = []
    for r in rows:
        # a long detail wraps onto more lines: its end ("is missing", "is truncated") is what matters
        cells = [textwrap.wrap(c, w, break_long_words=True, break_on_hyphens=False) or [""] for c, w in zip(r[:3], widths)]
        for k in range(max(len(c) for c in cells)):
            row = "  ".join((c[k] if k < len(c) else "").ljust(w) for c, w in zip(cells, widths))
            lines.append((row + ("  " + r[3] if r[3] and k == 0 else "")).rstrip())
    return "\n".join(lines)
