"""The likely cause of a failing :func:`~posenc.testing.check_rope` report, from the error's pattern.

When a float32 probe fails, the implementation is run once more on ``arange(64)`` and candidate
explanations are fitted against its output (in float64, on the same unit-norm inputs):

=================  ===========================================================================
cause              how it is recognized
=================  ===========================================================================
pairing            the reference rotated with the other layout (interleaved ``(x[2i], x[2i+1])``
                   vs half-split ``(x[i], x[i + r/2])``) is within the threshold
positions          the reference at ``position_ids + delta`` (``delta`` in -2..2) is, or the
                   fast pairs' angle at position 0 is one fractional ``delta`` times their rate
base               each pair's angle grows linearly with the position (read back from the
                   output: ``atan2``, unwrapped), pair 0's rate is right and the ratio to the
                   config's frequencies is ``(theta / theta')^(2i/r)``: the implied ``theta'``
scaling factor     every pair's rate is the config's times one constant (a linear factor)
scaling band       the high-frequency pairs are right, only the low ones (long wavelengths) are
                   off: the band a scaling type (YaRN, Llama-3) changes, or its factor
attention factor   angles right, the output's length another multiple of the input's
=================  ===========================================================================

Nothing is named when none fits (or the implementation is right on ``arange(64)``: then the
fault is in a far probe's frequencies or length switch, which the failing probe names).
Shapes: ``q [b, h, s, d]``, angles ``[s, n]`` (``n = r/2`` pairs, ``r`` the rotary span).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..kernels.reference import apply_rotary_reference
from .reference import Reference

#: ``outputs(position_ids [1, s]) -> (q [1, h, s, d], the implementation's q' [1, h, s, d],
#: threshold)`` in float64, or None when the implementation could not be run or judged.
Outputs = Callable[[torch.Tensor], "tuple[torch.Tensor, torch.Tensor, float] | None"]
WINDOW = 64
LAYOUT_WORDS = {
    "half": "half-split (x[i], x[i + r/2])",
    "interleaved": "interleaved (x[2i], x[2i+1])",
}


@dataclass(frozen=True)
class Diagnosis:
    """``cause``: one of ``pairing``, ``positions``, ``base``, ``scaling factor``, ``scaling
    band``, ``attention factor``; ``evidence``: what fitted; ``value``: the implied offset, base or factor if any."""

    cause: str
    evidence: str
    value: float | None = None

    def __str__(self) -> str:
        return f"likely cause: {self.cause}: {self.evidence}"


def diagnose(ref: Reference, outputs: Outputs) -> Diagnosis | None:
    """Fit the candidate causes (module docstring) to the implementation's output on
    ``arange(64)``; None when none fits or the output there is right."""
    pos = torch.arange(WINDOW)[None]  # [1, s]
    got = outputs(pos)
    if got is None:
        return None
    q, out, threshold = got
    cos, sin = ref.cos_sin(pos)  # float64 [1, s, n]
    err = _err(out, ref.rotate(q, cos, sin))
    if err <= threshold:
        return None
    other = "interleaved" if ref.layout == "half" else "half"
    swapped = _err(out, apply_rotary_reference(q, cos[:, None], sin[:, None], other, ref.span))
    if swapped <= threshold:
        at_1 = _err(out[:, :, 1], ref.rotate(q, cos, sin)[:, :, 1])
        return Diagnosis(
            "pairing",
            f"the implementation pairs {LAYOUT_WORDS[other]} where the config pairs "
            f"{LAYOUT_WORDS[ref.layout]}: rotated that way its error falls from {err:.3g} to "
            f"{swapped:.3g} (threshold {threshold:.3g}); at position 1 it is {at_1:.3g} already",
        )
    for delta in (-1, 1, -2, 2):
        shifted = _err(out, ref.rotate(q, *ref.cos_sin(pos + delta)))
        if shifted <= threshold:
            return Diagnosis(
                "positions",
                f"the output equals the reference at position_ids {delta:+d} (error "
                f"{shifted:.3g}, threshold {threshold:.3g}; {err:.3g} at position_ids)",
                float(delta),
            )
    if ref.mrope:
        return None
    return _frequencies(ref, q, out)


def _err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().nan_to_num(nan=math.inf).max())


def _pairs(ref: Reference, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The two channels of each rotated pair, ``[b, h, s, n]`` each, in the config's layout."""
    rot = x[..., : ref.span]
    if ref.layout == "half":
        return rot[..., : ref.span // 2], rot[..., ref.span // 2 :]
    return rot[..., 0::2], rot[..., 1::2]


def _angles(ref: Reference, q: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Each pair's rotation angle ``[s, n]``, unwrapped along the positions (steps < pi)."""
    a, b = _pairs(ref, q)
    a2, b2 = _pairs(ref, out)
    theta = torch.atan2(a * b2 - b * a2, a * a2 + b * b2)  # [b, h, s, n]
    theta = theta.flatten(0, 1).median(dim=0).values  # [s, n]: robust over the heads
    step = torch.remainder(theta.diff(dim=0) + math.pi, 2 * math.pi) - math.pi  # [s - 1, n]
    return torch.cat((theta[:1], theta[:1] + step.cumsum(dim=0)))  # [s, n]


def _frequencies(ref: Reference, q: torch.Tensor, out: torch.Tensor) -> Diagnosis | None:
    """The base / scaling factor / scaling band candidates, from each pair's angle rate."""
    theta = _angles(ref, q, out)  # [s, n]
    p = torch.arange(WINDOW, dtype=torch.float64)
    pc = p - p.mean()
    rate = (pc[:, None] * theta).sum(0) / (pc**2).sum()  # [n]: least-squares slope
    want = ref.exact.frequencies(WINDOW)[0].to(torch.float64)  # [n]
    # A pair is off when its rate drifts by more than 1e-4 rad over the window (and 0.1 %).
    off = (rate - want).abs() * (WINDOW - 1) > torch.maximum(
        torch.tensor(1e-4), 1e-3 * want * (WINDOW - 1)
    )
    if not bool(off.any()):
        return _offset_or_gain(ref, q, out, theta[0], want)
    ratio = rate / want  # [n]
    n = ratio.numel()
    if bool(off.all()) and float(ratio.std() / ratio.mean().abs()) < 1e-2:
        return _factor(ref, float(ratio.mean()))
    if not bool(off[0]):
        base = _implied_base(ref, ratio)
        if base is not None:
            return base
        first = int(off.float().argmax())  # > 0: pair 0 is right
        wavelength = 2 * math.pi / float(want[first])
        lo, hi = float(ratio[off].min()), float(ratio[off].max())
        return Diagnosis(
            "scaling band",
            f"the high-frequency pairs 0..{first - 1} are right, {int(off.sum())} of the "
            f"{n - first} pairs from {first} on (wavelengths >= {wavelength:.4g} tokens) turn "
            f"{lo:.3g}x..{hi:.3g}x as fast as the config's: a scaling type's band or factor "
            f"({_scaling_words(ref)})",
        )
    return None


def _factor(ref: Reference, ratio: float) -> Diagnosis:
    scaling = ref.exact.scaling or {}
    factor = float(scaling.get("factor", 1.0)) if scaling.get("rope_type") == "linear" else 1.0
    implied = factor / ratio
    has = f"config: {factor:g}" if factor != 1.0 else "the config has none"
    return Diagnosis(
        "scaling factor",
        f"every pair turns {ratio:.4g}x as fast as the config's (right at position 0, the error "
        f"grows with position): implied linear factor {implied:.4g} ({has})",
        implied,
    )


def _offset_or_gain(
    ref: Reference, q: torch.Tensor, out: torch.Tensor, theta0: torch.Tensor, want: torch.Tensor
) -> Diagnosis | None:
    """Right rates: a fractional position offset (angle ``delta * f`` at position 0 on the
    fast pairs) or a magnitude other than the attention factor, or None."""
    fast = want > 0.01  # [n]: pairs whose angle at position 0 resolves an offset
    delta = theta0[fast] / want[fast]
    if bool(fast.any()) and float(theta0[fast].abs().max()) > 1e-5:
        mean = float(delta.mean())
        if float(delta.std()) < 0.05 * abs(mean) + 1e-9:
            return Diagnosis(
                "positions",
                f"the rates are right, but at position 0 each fast pair's angle is already "
                f"{mean:.3g} times its frequency: positions offset by {mean:.3g}",
                mean,
            )
    a, b = _pairs(ref, q)
    a2, b2 = _pairs(ref, out)
    gain = float((a2.hypot(b2) / a.hypot(b)).median())
    factor = float(ref.attention_factor)
    if abs(gain / factor - 1) > 1e-6:
        return Diagnosis(
            "attention factor",
            f"angles right, every pair's length is {gain:.7g}x its input's where the config's "
            f"attention factor is {factor:.7g}",
            gain,
        )
    return None


def _implied_base(ref: Reference, ratio: torch.Tensor) -> Diagnosis | None:
    """``ratio_i = (theta / theta')^(2i/r)``: fit ``ln ratio = -x ln(theta'/theta)``
    (``x = 2i/r``) through the origin; a fit within 2 % gives ``theta'``."""
    n = ratio.numel()
    x = torch.arange(n, dtype=torch.float64) * 2 / ref.span  # [n]
    y = ratio.clamp(min=1e-300).log()
    k = float((x * y).sum() / (x * x).sum())
    fit = (y - k * x).abs().max()
    if abs(k) < 1e-6 or float(fit) > 0.02 * max(abs(k) * float(x.max()), 1e-3):
        return None
    base = ref.exact.base * math.exp(-k)
    return Diagnosis(
        "base",
        f"the error is 0 at position 0 and grows with position; each pair's angle drifts "
        f"linearly with the position, pair i turning (theta / theta')^(2i/r) as fast as the "
        f"config's: implied rope_theta {base:.6g} (config: {ref.exact.base:g})",
        base,
    )


def _scaling_words(ref: Reference) -> str:
    scaling = ref.exact.scaling
    if not scaling:
        return "the config has no scaling"
    keys = ", ".join(f"{k}={v}" for k, v in scaling.items() if k != "rope_type")
    return f"config: {scaling.get('rope_type')} {keys}".rstrip()
