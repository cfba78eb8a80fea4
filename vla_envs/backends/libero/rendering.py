"""Headless OpenGL for MuJoCo: EGL or OSMesa, chosen once per process before MuJoCo loads.

``MUJOCO_GL`` set by the user wins, once a probe shows it renders (a ``glfw`` left set on a node
without a display would otherwise fail in every worker). Otherwise each backend is probed in a
throwaway subprocess (a failed GL init can abort the process that tries it) and the first that
renders is exported, so worker processes inherit it.
"""

from __future__ import annotations

import os
import subprocess
import sys

from vla_envs.errors import VlaEnvError

CANDIDATES = ("egl", "osmesa")
_PROBE = "import mujoco; c = mujoco.GLContext(16, 16); c.make_current(); c.free()"


class RenderingUnavailableError(VlaEnvError):
    """Neither EGL nor OSMesa can create an OpenGL context here."""


def probe(backend: str) -> str | None:
    """None if ``backend`` renders here, else the error it printed."""
    env = {**os.environ, "MUJOCO_GL": backend, "PYOPENGL_PLATFORM": backend}
    try:
        out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return "timed out"
    return None if out.returncode == 0 else (out.stderr.strip().splitlines() or ["failed"])[-1]


def find_gl() -> tuple[str | None, dict[str, str], bool]:
    """``(backend, errors, user_set)``: the backend LIBERO would use (the user's ``MUJOCO_GL`` if it
    renders, else the first of ``CANDIDATES`` that does; None if none), why each tried one failed,
    and whether ``MUJOCO_GL`` was set. Sets nothing (``vla-envs doctor`` asks the same question)."""
    chosen = os.environ.get("MUJOCO_GL")
    tried = [chosen] if chosen else list(CANDIDATES)
    errors = {}
    for backend in tried:
        err = probe(backend)
        if err is None:
            return backend, errors, bool(chosen)
        errors[backend] = err
    return None, errors, bool(chosen)


def ensure_gl() -> str:
    """The headless GL backend in use (sets ``MUJOCO_GL`` / ``PYOPENGL_PLATFORM`` if unset).

    Raises:
        RenderingUnavailableError: naming the env var and the Debian packages to install.
    """
    backend, errors, user_set = find_gl()
    if user_set and backend is None:
        chosen = os.environ["MUJOCO_GL"]
        raise RenderingUnavailableError(
            f"MUJOCO_GL={chosen} is set in the environment but cannot render here ({errors[chosen]}); unset it "
            f"to use the first of {', '.join(CANDIDATES)} that works, or set one that does "
            "(`vla-envs doctor` checks each)")
    if backend is None:
        raise RenderingUnavailableError(
            "LIBERO needs headless OpenGL and neither backend works here ("
            + "; ".join(f"{k}: {v}" for k, v in errors.items())
            + "). Install EGL (Debian: apt-get install libegl1 libgl1-mesa-dri) or OSMesa "
            "(apt-get install libosmesa6), or set MUJOCO_GL to a backend that works.")
    if user_set:
        os.environ.setdefault("PYOPENGL_PLATFORM", backend)
    else:  # exported: the worker processes inherit it
        os.environ["MUJOCO_GL"] = os.environ["PYOPENGL_PLATFORM"] = backend
    return backend
