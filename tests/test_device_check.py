"""experiments/benchmarks/device_check.py in its --quick mode (tiny shapes on the CPU), so that
the one command a GPU session runs is known to work before it gets the device."""

import os
import sys

import pytest

HERE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments")
sys.path.insert(0, os.path.join(HERE, "benchmarks"))

import device_check  # noqa: E402


# long: the whole check end to end (~60 s); the README's command stays under 15 minutes
@pytest.mark.long
def test_device_check_quick_measures_every_part_against_its_roofline(tmp_path):
    out = tmp_path / "dc.json"
    res = device_check.main(
        ["--quick", "--skip", "population", "--no-kernel-tests", "--out", str(out)]
    )
    assert res["errors"] == {}
    assert res["bandwidth"]["bytes_per_s"] > 0 and res["matmul"]["flops_per_s"] > 0
    assert res["kernels"]["paged_kernel_max_abs_diff"] < 1e-4
    for mix in ("long_tail", "uniform"):
        for engine in ("static", "continuous"):
            v = res["decode"][mix][engine]
            assert v["decode_steps"] > 0 and v["ideal_bytes"] > 0
            assert v["roofline_fraction"] > 0
    assert 0 < res["update"]["mfu"]
    assert out.exists()
    assert "decode long_tail continuous / static" in device_check.table(res)


def test_device_check_refuses_unknown_parts():
    with pytest.raises(SystemExit, match="not parts"):
        device_check.main(["--quick", "--skip", "decoding"])


@pytest.mark.long
def test_device_check_population_part_quick(tmp_path):
    """The population part (2 seeds of runlocal, one step each, as a population and one after
    another): runs per hour of both arms and their ratio."""
    res = device_check.main(
        [
            "--quick",
            "--skip",
            "bandwidth,matmul,kernels,decode,update",
            "--out",
            str(tmp_path / "p.json"),
        ]
    )
    assert res["errors"] == {}
    assert res["population"]["ratio"] > 0
