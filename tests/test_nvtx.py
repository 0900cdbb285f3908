"""NVTX ranges are safe no-ops without a profiler and refuse names that would break ncu filters."""
from __future__ import annotations

import pytest

from dpk import nvtx


def test_ranges_nest_and_return_values():
    wrapped = nvtx.ranged(lambda: 42, "conv1d", "stream", "c1024.fp32")
    assert wrapped() == 42
    with nvtx.Ranges("a", "b"):
        pass


def test_names_with_filter_syntax_are_rejected():
    with pytest.raises(ValueError, match="may not contain"):
        nvtx.Ranges("conv1d", "bad/name")
    with pytest.raises(ValueError, match="may not contain"):
        nvtx.ncu_filter("conv1d", "x@y")


def test_filter_and_command():
    assert nvtx.ncu_filter("gn_mish", "fused") == "dpk@gn_mish/fused/"
    cmd = nvtx.ncu_command("gn_mish", "fused", "b1_c256_l16.fp32", suite="pusht", out="r")
    assert cmd.startswith("ncu --nvtx --nvtx-include dpk@gn_mish/fused/b1_c256_l16.fp32/ --clock-control none -o r")
    assert "--suite pusht" in cmd


def test_a_filter_reaches_a_range_inside_the_variant():
    from dpk.nvtx import ncu_filter

    assert ncu_filter("unet1d", "kernels", "blog_b1_step.fp32", ["down1.res0.conv1"]) == \
        "dpk@unet1d/kernels/blog_b1_step.fp32/down1.res0.conv1/"
    with pytest.raises(ValueError, match="needs a case"):
        ncu_filter("unet1d", "kernels", None, ["down1.res0.conv1"])
