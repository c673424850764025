"""Figures to files, offline: the dashboard's Altair charts as SVG or PNG for docs/.

Why: the pictures in docs/ and those on the dashboard must speak one
vocabulary, so static plots are the same Altair figure functions
(`dashboard.views`), rendered here without a browser or network by
vl-convert (Vega's own renderer in a Python wheel).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import vl_convert as vlc

PNG_SCALE = 2.0
"""PNG pixels per chart pixel (sharp on high-density screens)."""


def save(chart: Any, path: str | Path) -> Path:
    """Write `chart` to `path`: .svg or .png by the suffix. Returns the path."""
    p = Path(path)
    spec = chart.to_json()
    p.parent.mkdir(parents=True, exist_ok=True)
    if p.suffix.lower() == ".svg":
        p.write_text(vlc.vegalite_to_svg(spec))
    elif p.suffix.lower() == ".png":
        p.write_bytes(vlc.vegalite_to_png(spec, scale=PNG_SCALE))
    else:
        raise ValueError(f"{p}: a figure is written as .svg or .png, not {p.suffix or 'no suffix'!r}")
    return p
