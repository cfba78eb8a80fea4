"""The printable board: a PNG with its DPI recorded and a PDF page at true scale.

Printing is where a board most often goes wrong: "fit to page" shrinks it by a few percent and
every distance the camera measures shrinks with it. The PDF places the board at its exact
physical size on a standard page (the smallest of A4, Letter, A3 that holds it with a margin,
else a page cut to size), and prints the square length beside it to check with a ruler.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from calibration.board import BoardSpec, board_image

MM_PER_INCH = 25.4
# (name, width_mm, height_mm) in portrait; landscape is tried too
PAGES_MM = (("A4", 210.0, 297.0), ("Letter", 215.9, 279.4), ("A3", 297.0, 420.0))
MARGIN_MM = 10.0  # white quiet zone around the board, beyond most printers' unprintable edge (~5 mm)
LABEL_MM = 8.0  # the text line under the board


@dataclass(frozen=True)
class Printout:
    """What ``write_printout`` wrote and how the page is laid out (millimetres)."""

    png: Path
    pdf: Path
    board_json: Path
    page_name: str
    page_mm: tuple[float, float]
    board_origin_mm: tuple[float, float]
    """Lower-left corner of the board on the page, from the page's lower-left (PDF convention)."""
    png_dpi: float


def choose_page(spec: BoardSpec) -> tuple[str, float, float]:
    """The smallest standard page holding the board, its margins and the label; else a page
    cut to that size. Returns ``(name, width_mm, height_mm)``."""
    need_w = spec.width_m * 1000.0 + 2 * MARGIN_MM
    need_h = spec.height_m * 1000.0 + 2 * MARGIN_MM + LABEL_MM
    for name, w, h in PAGES_MM:
        for page_w, page_h, orient in ((w, h, "portrait"), (h, w, "landscape")):
            if need_w <= page_w and need_h <= page_h:
                return f"{name} {orient}", page_w, page_h
    return "custom", need_w, need_h


def write_printout(spec: BoardSpec, out_dir: str | Path, dpi: float = 600.0) -> Printout:
    """Write ``board.png``, ``board.pdf`` and ``board.json`` into ``out_dir``.

    Args:
        spec: the board.
        out_dir: created if missing.
        dpi: resolution of the board's raster (rounded so a square is a whole number of pixels;
            the PDF's scale does not depend on it).

    Returns:
        The paths and the page layout.
    """
    from matplotlib.figure import Figure
    from PIL import Image

    if not 72 <= dpi <= 2400:
        raise ValueError(f"dpi must be in [72, 2400], got {dpi}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    square_in = spec.square_length_m * 1000.0 / MM_PER_INCH
    px_per_square = max(8, round(square_in * dpi))
    png_dpi = px_per_square / square_in  # the DPI at which one square is exactly square_length_m
    board = board_image(spec, px_per_square)

    # PNG: the board with a one-square white quiet zone, DPI in its header
    margin_px = px_per_square
    framed = Image.new("L", (board.shape[1] + 2 * margin_px, board.shape[0] + 2 * margin_px), 255)
    framed.paste(Image.fromarray(board), (margin_px, margin_px))
    png = out / "board.png"
    framed.save(png, dpi=(png_dpi, png_dpi))

    # PDF: the board placed at its physical size; interpolation "none" embeds the raster as is
    page_name, page_w_mm, page_h_mm = choose_page(spec)
    board_w_mm, board_h_mm = spec.width_m * 1000.0, spec.height_m * 1000.0
    x0_mm = (page_w_mm - board_w_mm) / 2.0
    y0_mm = (page_h_mm - board_h_mm + LABEL_MM) / 2.0  # label below the board
    fig = Figure(figsize=(page_w_mm / MM_PER_INCH, page_h_mm / MM_PER_INCH))
    ax = fig.add_axes((x0_mm / page_w_mm, y0_mm / page_h_mm, board_w_mm / page_w_mm, board_h_mm / page_h_mm))
    ax.imshow(board, cmap="gray", vmin=0, vmax=255, interpolation="none", aspect="auto")
    ax.set_axis_off()
    label = (f"{spec.describe()}.  Print at 100 % (actual size, no 'fit to page'); "
             f"one square must measure {spec.square_length_m * 1000:g} mm.")
    fig.text(0.5, (y0_mm - 0.6 * LABEL_MM) / page_h_mm, label, ha="center", va="center", fontsize=7)
    pdf = out / "board.pdf"
    fig.savefig(pdf, format="pdf", metadata={"Title": spec.describe()})

    board_json = spec.save(out / "board.json")
    return Printout(png, pdf, board_json, page_name, (page_w_mm, page_h_mm), (x0_mm, y0_mm), png_dpi)


def printout_summary(p: Printout) -> str:
    """A few lines for the CLI."""
    return "\n".join([
        f"wrote {p.pdf} ({p.page_name}, {p.page_mm[0]:.1f} x {p.page_mm[1]:.1f} mm; print at 100 %)",
        f"wrote {p.png} ({p.png_dpi:.2f} dpi)",
        f"wrote {p.board_json}: {json.dumps(json.loads(p.board_json.read_text()))}",
    ])
