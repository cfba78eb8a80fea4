"""``resize_rgb``: the one resize between a camera (simulated or real) and the policy."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from vla_envs.core.images import resize_rgb


def smooth_image(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """A photo-like picture: random blobs upsampled bilinearly (no pixel noise for a filter to clip)."""
    coarse = rng.integers(0, 256, (max(h // 3, 2), max(w // 3, 2), 3), dtype=np.uint8)
    return np.asarray(Image.fromarray(coarse).resize((w, h), Image.BILINEAR))


@pytest.mark.parametrize("src,dst", [((270, 270), (64, 64)), ((480, 640), (224, 224)), ((256, 256), (224, 224)),
                                     ((240, 320), (120, 160)), ((64, 64), (96, 128))])
def test_it_is_the_antialiased_bicubic_filter_pillow_also_implements(src, dst):
    """Pillow's BICUBIC resize (antialiased, a = -0.5; written independently, in integer arithmetic
    rounded between its two passes) gives the same picture to within its rounding (a few grey
    levels at most, 0.1-0.2 on average); a box, bilinear or nearest filter is another picture."""
    rng = np.random.default_rng(sum(src) + sum(dst))
    image = smooth_image(rng, *src)
    ours = resize_rgb(image, dst).astype(int)
    pillow = lambda f: np.abs(ours - np.asarray(Image.fromarray(image).resize(dst[::-1], f)))  # noqa: E731
    assert pillow(Image.BICUBIC).max() <= 3 and pillow(Image.BICUBIC).mean() < 0.3
    for other in (Image.BOX, Image.BILINEAR, Image.NEAREST):
        assert pillow(other).max() > 10 and pillow(other).mean() > 1.5


def test_batches_types_and_the_identity():
    rng = np.random.default_rng(0)
    batch = np.stack([smooth_image(rng, 48, 80) for _ in range(6)]).reshape(2, 3, 48, 80, 3)
    out = resize_rgb(batch, (24, 40))
    assert isinstance(out, np.ndarray) and out.dtype == np.uint8 and out.shape == (2, 3, 24, 40, 3)
    np.testing.assert_array_equal(out[1, 2], resize_rgb(batch[1, 2], (24, 40)))  # each picture on its own
    as_tensor = resize_rgb(torch.from_numpy(batch), (24, 40))
    assert isinstance(as_tensor, torch.Tensor) and as_tensor.dtype == torch.uint8
    np.testing.assert_array_equal(as_tensor.numpy(), out)
    assert resize_rgb(batch, (48, 80)) is batch  # already that size: untouched, not copied
    read_only = batch[0, 0].copy()
    read_only.flags.writeable = False  # as Ray and shared memory hand them over
    np.testing.assert_array_equal(resize_rgb(read_only, (24, 40)), out[0, 0])
    flat = np.full((10, 10, 3), 200, np.uint8)
    assert (resize_rgb(flat, (3, 7)) == 200).all() and (resize_rgb(flat, (31, 17)) == 200).all()


@pytest.mark.parametrize("images,hw,match", [
    (np.zeros((8, 8, 3), np.float32), (4, 4), "uint8"),
    (np.zeros((8, 8, 4), np.uint8), (4, 4), r"\[\.\.\., H, W, 3\]"),
    (np.zeros((8, 3), np.uint8), (4, 4), "uint8"),
    (np.zeros((8, 8, 3), np.uint8), (0, 4), "positive"),
])
def test_bad_input_is_refused_naming_what_is_allowed(images, hw, match):
    with pytest.raises(ValueError, match=match):
        resize_rgb(images, hw)
