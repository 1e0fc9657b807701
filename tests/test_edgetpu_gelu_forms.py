"""LegalizeGeluInt8's two forms, measured over every code of x: the cubic form (the tanh form's
argument, x (a + b min(x^2, 9))) against the sloped one (1.702 x), each against the GELU kernel
the stock int8 model keeps, on the int8 reference kernels and in the rule's own model of them.

The ranges are those litert-quantizer gave EfficientFormer-L1's GELUs (x from +-10 to +-23, y
from -0.17 up, and its last, narrow one: x in [-1.9, 2.1]), and a +-4 one between.
"""

from __future__ import annotations

import numpy as np
import pytest
from rulekit import apply, ops
from test_edgetpu_headsplit import every_code, int8_gelu

from tflfuse.targets.edgetpu import gelu
from tflfuse.targets.edgetpu.gelu import (
    CLAMP,
    CUBIC_A,
    CUBIC_B,
    T_END,
    GeluPlan,
    LegalizeGeluInt8,
    cubic_ranges,
    form_codes,
    form_error,
)

# (x low, x high, y low, y high)
RANGES = [(-9.8, 9.73, -0.15, 9.72), (-22.7, 22.2, -0.17, 22.11), (-4.0, 4.0, -0.17, 4.0),
          (-1.9, 2.14, -0.17, 2.11)]  # fmt: skip


def _params(lo: float, hi: float, ylo: float, yhi: float) -> tuple[float, int, float, int]:
    s_x, s_y = (hi - lo) / 255, (yhi - ylo) / 255
    return s_x, round(-128 - lo / s_x), s_y, round(-128 - ylo / s_y)


def _rms(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.sqrt(np.mean((a - b) ** 2)))


@pytest.mark.parametrize("ranges", RANGES)
def test_the_cubic_form_is_closer_to_the_gelu_kernel_than_the_sloped_one(ranges) -> None:
    """In y's steps over x's 256 codes (the rule's model of the kernels): the cubic form's rms
    distance to the GELU kernel's codes is at most 0.65 of the sloped form's (0.44 on +-10,
    0.64 on the narrow one, 0 against 0.11 on +-22), and its largest no larger."""
    params = _params(*ranges)
    sloped, cubic = form_error("sloped", *params, False), form_error("cubic", *params, False)
    assert cubic[0] <= 0.65 * sloped[0] and cubic[1] <= sloped[1]
    assert gelu.choose_form(*params, False) == GeluPlan("cubic", cubic[1])


def test_the_rules_model_of_the_forms_is_what_the_int8_kernels_compute(monkeypatch) -> None:
    """Each form rewritten and run on the reference kernels for every code of x: the codes are
    the rule's `form_codes` but for at most 2 of 256 (by one: the kernels' fixed-point
    rounding), and the cubic model is closer to the GELU kernel than the sloped one there too."""
    for ranges in RANGES:
        params = _params(*ranges)
        before = int8_gelu(False, params[:2], params[2:])
        kernel = every_code(before)
        got = {}
        for form in ("cubic", "sloped"):
            steps = form_error(form, *params, False)[1]
            monkeypatch.setattr(
                gelu, "choose_form", lambda *a, f=form, s=steps, **k: GeluPlan(f, s)
            )
            after, model, result = apply(before, LegalizeGeluInt8())
            assert result.fired() == {"LegalizeGeluInt8": 1}
            assert len(ops(model)) == (7 if form == "cubic" else 4)
            got[form] = every_code(after)
            off = got[form] - form_codes(form, *params)
            assert np.count_nonzero(off) <= 2 and np.abs(off).max() <= 1
            assert np.abs(got[form] - kernel).max() <= steps  # within what it declares
        assert _rms(got["cubic"], kernel) <= 0.7 * _rms(got["sloped"], kernel)


def test_the_cubic_forms_ranges_are_the_image_of_xs() -> None:
    """Wide x: x^2 is held at CLAMP^2 (q = b x^2 saturates at b 9) and t is cut at +-T_END,
    where LOGISTIC's int8 output is its end code; narrow x: each range is the image of x's."""
    wide = cubic_ranges(*_params(*RANGES[0])[:2])
    assert wide.q[0] * 255 == pytest.approx(CUBIC_B * CLAMP**2) and wide.q[1] == -128
    assert wide.k[0] * 255 == pytest.approx(CUBIC_A + CUBIC_B * CLAMP**2)
    assert wide.t[0] * 255 == pytest.approx(2 * T_END, rel=1e-6)
    s_x, z_x = _params(*RANGES[3])[:2]
    high = s_x * (127 - z_x)
    narrow = cubic_ranges(s_x, z_x)
    assert narrow.q[0] * 255 == pytest.approx(CUBIC_B * high**2)
    low = s_x * (-128 - z_x)
    image = [v * (CUBIC_A + CUBIC_B * v * v) for v in (low, high)]  # t over [-3.5, 4.1]
    assert narrow.t[0] * 255 == pytest.approx(image[1] - image[0], rel=1e-6)
    assert image[1] - image[0] < 2 * T_END
    # where |x| > CLAMP, sigma(t) is at its end codes, as the kernel's Phi is at 1/256
    x = np.array([CLAMP, -CLAMP])
    t = x * (CUBIC_A + CUBIC_B * x * x)
    assert 1 / (1 + np.exp(-t[0])) > 254.5 / 256 and 1 / (1 + np.exp(-t[1])) < 0.5 / 256
