"""The one resize every camera picture goes through before a policy sees it.

A simulated camera renders at its own resolution and a real camera streams at its own; both are
cropped there and resized to the model's ``image_size`` by ``resize_rgb``, so a twin's picture
and a real frame of the same view differ by the scene only, never by the filter. The filter is
the one the reference's OpenVLA image processor applies to the rendered frames it trains and
evaluates on (torchvision's tensor resize: bicubic, antialiased, rounded back to uint8), so a
checkpoint trained there sees the same pixels here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

import numpy as np

if TYPE_CHECKING:
    import torch

Images = TypeVar("Images", np.ndarray, "torch.Tensor")


def resize_rgb(images: Images, hw: tuple[int, int]) -> Images:
    """uint8 RGB ``[..., H, W, 3]`` resized to ``hw = (height, width)``, same type and device.

    Antialiased bicubic (``torch.nn.functional.interpolate(mode="bicubic", antialias=True)``,
    as torchvision's resize of a tensor), clamped and rounded to uint8. Returned as given when
    it already has that size.

    Raises:
        ValueError: not uint8 ``[..., H, W, 3]``, or a size that is not two positive integers.
    """
    import torch
    import torch.nn.functional as F

    out_h, out_w = (int(v) for v in hw)
    if out_h < 1 or out_w < 1:
        raise ValueError(f"resize_rgb: the size must be two positive integers (height, width), got {hw}")
    if images.dtype not in (np.uint8, torch.uint8) or images.ndim < 3 or images.shape[-1] != 3:
        raise ValueError(f"resize_rgb: images must be uint8 [..., H, W, 3] RGB, got {images.dtype} "
                         f"{tuple(images.shape)}")
    if tuple(images.shape[-3:-1]) == (out_h, out_w):
        return images
    as_numpy = isinstance(images, np.ndarray)
    x = torch.from_numpy(np.require(images, requirements=["C", "W"])) if as_numpy else images
    lead = x.shape[:-3]
    x = x.reshape(-1, *x.shape[-3:]).permute(0, 3, 1, 2).float()
    y = F.interpolate(x, size=(out_h, out_w), mode="bicubic", antialias=True, align_corners=False)
    y = y.clamp_(0, 255).round_().to(torch.uint8).permute(0, 2, 3, 1).reshape(*lead, out_h, out_w, 3)
    return y.numpy() if as_numpy else y.contiguous()
