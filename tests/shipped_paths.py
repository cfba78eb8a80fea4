"""Where the project's shipped artefacts are, for the tests that start from them."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHIPPED_WARM_START = ROOT / "warm_start" / "tiny-openvla-oft-put-on-plate"
"""The shipped warm start (``scripts/make_warm_start.sh`` made it; its ``made_by.json`` says how)."""
