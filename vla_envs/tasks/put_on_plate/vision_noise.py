"""The Vision OOD variants' image noise, as the reference's evaluation makes it.

Each table photo of the pack comes with a texture image and a ``mix`` (its noise strength; 0-0.3
in the procedural pack). With texture noise, the texture is stretched over the box around the robot and
objects in view and blended into their pixels; with whole-image noise, a window the size of the
view is cut from the texture at twice the view's size, starting at that box's centre, and blended
into every pixel. The weight is the variant's factor (0.3 or 0.5) times the photo's ``mix``.

The reference computes the box on its full 640x480 render; a view with ``camera_crop`` sees only
part of the robot, so here the box is the one around what this view shows (the same box when
there is no crop). Each env's texture is stretched over its own box (the reference stretches it
over the largest box of the batch and cuts each env's part, so one env's pixels depend on its
batch mates).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image


class VisionNoise:
    """Texture and whole-image noise for views of ``image_hw`` pixels showing the region
    ``crop_fractions`` (left, top, right, bottom, as fractions of the whole camera view).

    Args:
        overlays: the pack's ``Overlay`` records (``texture_file``, ``mix``), indexed as episodes index them.
        image_hw: the rendered view's (height, width).
        crop_fractions: the region of the camera's whole view the rendered view shows.
    """

    def __init__(self, overlays: Sequence, image_hw: tuple[int, int], crop_fractions: Sequence[float]):
        h, w = image_hw
        left, top, right, bottom = (float(f) for f in crop_fractions)
        # the texture pictures twice the whole view; stored at the resolution the view has here
        full_h, full_w = round(h / (bottom - top)), round(w / (right - left))
        size = (2 * full_w, 2 * full_h)
        self.textures = torch.stack([
            torch.as_tensor(np.array(Image.open(o.texture_file).convert("RGB").resize(size, Image.BILINEAR)))
            for o in overlays]).permute(0, 3, 1, 2).contiguous()  # uint8 [n_overlays, 3, 2H, 2W]
        self.mix = torch.tensor([float(o.mix) for o in overlays])  # [n_overlays]
        # where each pixel's centre lies in the whole view, as fractions of it
        self.view_x = left + (torch.arange(w) + 0.5) / w * (right - left)  # [W]
        self.view_y = top + (torch.arange(h) + 0.5) / h * (bottom - top)  # [H]
        self.crop = (left, top, right, bottom)

    def __call__(self, rgb: torch.Tensor, keep: torch.Tensor, overlay_ids: torch.Tensor,
                 texture_weight: float, image_weight: float) -> torch.Tensor:
        """Noised images: rgb uint8 ``[B, H, W, 3]`` (already green-screened), keep bool ``[B, H, W]``
        (robot and object pixels), overlay_ids int ``[B]`` -> uint8 ``[B, H, W, 3]``."""
        if not (texture_weight or image_weight):
            return rgb
        device = rgb.device
        b, h, w, _ = rgb.shape
        ids = overlay_ids.cpu()
        texture = self.textures[ids].to(device).float()  # [B, 3, 2H, 2W]
        mix = self.mix[ids].to(device)[:, None, None, None]  # [B, 1, 1, 1]
        x0, y0, x1, y1 = _boxes(keep)  # [B] each, pixels, inclusive
        out = rgb.float()
        if texture_weight:
            # the whole texture stretched over the box
            tx = (torch.arange(w, device=device)[None] - x0[:, None] + 0.5) / (x1 - x0 + 1)[:, None]  # [B, W]
            ty = (torch.arange(h, device=device)[None] - y0[:, None] + 0.5) / (y1 - y0 + 1)[:, None]  # [B, H]
            tex = _sample(texture, tx, ty)
            weight = mix * texture_weight
            out = torch.where(keep[..., None], (1 - weight) * out + weight * tex, out)
        if image_weight:
            # a window of the whole view's size at the box's centre, the texture being twice that size:
            # its first texel is the centre pixel's (whole pixels, as the reference takes them)
            left, top, right, bottom = self.crop
            xm = torch.clamp(torch.div(x0 + x1, 2, rounding_mode="floor"), 1, w - 1)
            ym = torch.clamp(torch.div(y0 + y1, 2, rounding_mode="floor"), 1, h - 1)
            cx = left + xm / w * (right - left)  # [B], fractions of the whole view
            cy = top + ym / h * (bottom - top)
            tx = (cx[:, None] + self.view_x.to(device)[None]) / 2  # [B, W], fractions of the texture
            ty = (cy[:, None] + self.view_y.to(device)[None]) / 2
            weight = mix * image_weight
            out = (1 - weight) * out + weight * _sample(texture, tx, ty)
        # truncated to uint8 as the reference does
        return out.clamp(0, 255).to(torch.uint8)


def _boxes(keep: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Per image, the inclusive pixel box (x0, y0, x1, y1) of the true pixels of bool ``[B, H, W]``;
    (0, 0, 0, 0) for an image without any."""
    rows, cols = keep.any(2), keep.any(1)  # [B, H], [B, W]
    h, w = rows.shape[1], cols.shape[1]
    y0, x0 = rows.float().argmax(1), cols.float().argmax(1)
    y1, x1 = h - 1 - rows.flip(1).float().argmax(1), w - 1 - cols.flip(1).float().argmax(1)
    empty = ~rows.any(1)
    return tuple(torch.where(empty, 0, v) for v in (x0, y0, x1, y1))


def _sample(texture: torch.Tensor, tx: torch.Tensor, ty: torch.Tensor) -> torch.Tensor:
    """Bilinear samples of float ``[B, 3, Ht, Wt]`` at the fractions ``tx`` ``[B, W]`` and ``ty``
    ``[B, H]`` of its width and height (0..1, clamped at the borders) -> float ``[B, H, W, 3]``."""
    b, h, w = tx.shape[0], ty.shape[1], tx.shape[1]
    grid = torch.stack([tx[:, None, :].expand(b, h, w), ty[:, :, None].expand(b, h, w)], -1) * 2 - 1
    return F.grid_sample(texture, grid.float(), mode="bilinear", padding_mode="border",
                         align_corners=False).permute(0, 2, 3, 1)
