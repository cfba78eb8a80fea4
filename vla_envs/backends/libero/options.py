"""LIBERO's options: ``gym.make("libero_spatial", num_envs=N, **options)`` (the group is the env id).

Checked when made, before any simulator starts; ``fast_render`` is training only
(``gym.make(..., evaluation=True)`` refuses it).
"""

from __future__ import annotations

from dataclasses import dataclass

from vla_envs.core.options import TaskOptions, training_only


@dataclass(kw_only=True, frozen=True)
class LiberoOptions(TaskOptions):
    """What one LIBERO env is made with; the defaults are the OpenVLA / OpenVLA-OFT evaluation protocol."""

    BACKEND_OPTIONS = ("vectorization",)

    image_size: int = 256
    """Side of both pictures in pixels (256: the evaluation protocol; see ``native_render``)."""
    wrist: bool = True
    """Also return the wrist camera as ``wrist_image``."""
    settle_steps: int = 10
    """No-op steps after each reset, while objects settle (10: the evaluation protocol)."""
    fast_render: bool = training_only("changes the rendered pixels (anti-aliasing off)", default=False)
    """Turn multisample anti-aliasing off: about 1.7x faster rendering, slightly different pixels."""
    native_render: bool = True
    """Render both cameras at 256 px (the protocol's) and resize the pictures to ``image_size`` with
    ``vla_envs.core.images.resize_rgb``, as the reference's image processor resizes its 256 px
    renders for a 224 px model. False: render at ``image_size``: other pixels than the reference's
    (no measurable speed difference on CPU), so evaluate a policy with the setting it was trained with."""

    def __post_init__(self) -> None:
        def whole(value) -> bool:
            return isinstance(value, int) and not isinstance(value, bool)

        self._need(whole(self.image_size) and self.image_size >= 1, "image_size", "an integer >= 1 (pixels)")
        self._need(whole(self.settle_steps) and self.settle_steps >= 0, "settle_steps", "an integer >= 0")
        for name in ("wrist", "fast_render", "native_render"):
            self._need(isinstance(getattr(self, name), bool), name, "true or false")
