"""The Panda variants of the twin: the stock one, and a low-polygon one for CPU training.

Software rendering cost is dominated by the stock Panda's ~135k-triangle visual meshes; the
low-poly variant renders the Panda's own (shipped) collision meshes (~2.3k triangles)
instead. Same kinematics, dynamics and controllers; for training on CPU only, never for
evaluation (it looks different).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from mani_skill import PACKAGE_ASSET_DIR
from mani_skill.agents.registration import register_agent
from mani_skill.agents.robots.panda.panda import Panda

STOCK_URDF = Path(PACKAGE_ASSET_DIR) / "robots" / "panda" / "panda_v2.urdf"


def ensure_lowpoly_panda() -> Path:
    """Write (once) a URDF whose visuals are the collision meshes, with absolute mesh paths."""
    cache = Path(os.environ.get("VLA_ENVS_CACHE_DIR", Path.home() / ".cache" / "vla_envs"))
    target = cache / "panda_lowpoly_v1.urdf"
    if target.is_file():
        return target
    text = STOCK_URDF.read_text()
    text = re.sub(r'meshes/visual/(\w+)\.glb', r'meshes/collision/\1.stl', text)
    text = text.replace('filename="franka_description/', f'filename="{STOCK_URDF.parent}/franka_description/')
    cache.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(text)
    tmp.replace(target)
    return target


@register_agent()
class PandaLowPoly(Panda):
    """``robot_uids="panda_lowpoly"``: the Panda rendered with its collision meshes."""

    uid = "panda_lowpoly"
    urdf_path = str(ensure_lowpoly_panda())
