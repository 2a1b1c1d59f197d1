"""The lab figure's lines are told apart: in the default grid's figure (13 encodings as trained,
learned's interpolation and RoPE's four rescalings beside their base models) every line, across
all four panels, has a (colour, line style) of its own, and a label drawn in two panels is drawn
the same in both."""

from __future__ import annotations

import pytest

pytest.importorskip("matplotlib")

from matplotlib.colors import to_hex

from posenc.lab.cells import presets as P
from posenc.plots.lab import draw_lab, lab_data

LENGTHS = (16, 32, 64)
VARIANTS = {"learned": {"interp": "interp"},
            "rope": {"linear": "PI", "ntk": "NTK", "dynamic": "dyn-NTK", "yarn": "YaRN"}}  # fmt: skip


def _result(k: int, n: int) -> dict:
    bits = 3.0 + 0.01 * k + 0.001 * n
    curve = {"pos": [0, 4, 16], "end": [4, 16, n], "bits": [bits, bits + 0.1, bits + 0.2]}
    return {"bits": bits, "acc": None, "tokens": 64, "note": None, "curve": curve}


def default_grid_rows(encodings: tuple[str, ...]) -> list[dict]:
    rows = []
    for k, enc in enumerate(encodings):
        names = {"base": "", **VARIANTS.get(enc, {})}
        variants = {v: {"label": label, "results": {str(n): _result(k + j, n) for n in LENGTHS}}
                    for j, (v, label) in enumerate(names.items())}  # fmt: skip
        rows.append({"encoding": enc, "seed": 0, "train_len": LENGTHS[0], "group": "g",
                     "eval": {"unit": "byte", "lengths": list(LENGTHS), "variants": variants}})  # fmt: skip
    return rows


def _style(line) -> tuple[str, str]:  # Line2D keeps its resolved dashes privately
    """A drawn line's colour and its line style as matplotlib resolves it (a named style and
    its dash tuple compare alike)."""
    offset, dashes = line._unscaled_dash_pattern
    return to_hex(line.get_color()), repr((offset, tuple(dashes) if dashes else None))


@pytest.mark.parametrize("encodings", [P.preset("cpu-small").encodings,
                                       tuple(f"e{i}" for i in range(26))])  # fmt: skip
def test_every_line_of_the_figure_has_its_own_colour_and_style(encodings) -> None:
    import matplotlib.pyplot as plt

    fig = draw_lab(lab_data(default_grid_rows(encodings)))
    try:
        by_label: dict[str, set] = {}
        for ax in fig.axes:
            for line in ax.get_lines():
                if not line.get_label().startswith("_"):
                    by_label.setdefault(line.get_label(), set()).add(_style(line))
        want = len(encodings) + sum(len(VARIANTS.get(e, {})) for e in encodings)
        assert len(by_label) == want, sorted(by_label)
        assert all(len(s) == 1 for s in by_label.values()), by_label  # one style per label
        styles = [next(iter(s)) for s in by_label.values()]
        assert len(set(styles)) == len(styles), by_label  # no two labels alike
        # and each panel's lines differ by colour alone (not only by a dash pattern), while
        # the colours fit: at most 20 encodings and 8 variants a panel
        for ax in fig.axes:
            colours = [to_hex(ln.get_color()) for ln in ax.get_lines()
                       if not ln.get_label().startswith("_")]  # fmt: skip
            if len(colours) <= 20:
                assert len(set(colours)) == len(colours), (ax.get_title(), colours)
    finally:
        plt.close(fig)
