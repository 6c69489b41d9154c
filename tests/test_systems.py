"""System catalog: every required system, aliases, sourced numbers, custom YAML systems and their errors."""

from __future__ import annotations

import csv

import pytest

from conftest import run_cli
from moetune.catalog.systems import get_system, list_systems, load_system_file
from moetune.errors import InputError, UnknownNameError

REQUIRED = ["DGX-A100", "DGX-H100", "DGX-H200", "DGX-B200", "DGX-B300", "GB200-NVL72", "GB300-NVL72"]


def test_required_systems_present():
    names = {s.name for s in list_systems()}
    assert set(REQUIRED) <= names


@pytest.mark.parametrize(
    ("alias", "name"),
    [
        ("DGX-GB200", "GB200-NVL72"),
        ("dgx_gb200", "GB200-NVL72"),
        ("GB200", "GB200-NVL72"),
        ("DGX-GB300", "GB300-NVL72"),
        ("gb300 nvl72", "GB300-NVL72"),
        ("H100", "DGX-H100"),
        ("dgx_h100", "DGX-H100"),
        ("B200", "DGX-B200"),
        ("b300", "DGX-B300"),
        ("H200", "DGX-H200"),
        ("dgx_a100", "DGX-A100"),
    ],
)
def test_aliases(alias, name):
    assert get_system(alias).name == name


def test_perf_table_systems_resolve(shared_data):
    rows = list(csv.DictReader((shared_data / "perf" / "mbridge_perf_calibration.csv").open()))
    for system in {r["system"] for r in rows}:
        get_system(system)


@pytest.mark.parametrize("name", REQUIRED)
def test_numbers_have_sources_and_sane_ranges(name):
    s = get_system(name)
    for key in ("peak_tflops", "hbm", "hbm_gib", "nvlink", "scaleout", "host_cpu"):
        assert s.sources.get(key), f"{name}: no source for {key}"
    p = s.gpu.peak_tflops
    assert p["fp16"] == p["bf16"]
    if s.gpu.arch == "ampere":
        assert "fp8" not in p and "nvfp4" not in p
    if s.gpu.arch == "hopper":
        assert p["fp8"] == pytest.approx(2 * p["bf16"], rel=0.01) and "mxfp8" not in p and "nvfp4" not in p
    if s.gpu.arch == "blackwell":
        assert p["mxfp8"] == p["fp8"] == 2 * p["bf16"]
        assert p["nvfp4"] >= 2 * p["fp8"]
    assert s.nvlink_domain % s.gpus_per_node == 0
    assert s.scaleout_bw_gbs < s.nvlink_bw_gbs


def test_table_values():
    gb200, gb300, h100 = get_system("GB200-NVL72"), get_system("GB300-NVL72"), get_system("DGX-H100")
    assert (gb200.gpus_per_node, gb200.nvlink_domain) == (4, 72)
    assert gb200.gpu.peak_tflops["bf16"] == 2500 and gb300.gpu.peak_tflops["nvfp4"] == 15000
    assert h100.gpu.peak_tflops["bf16"] == 989 and h100.nvlink_bw_gbs == 450
    assert 79 < h100.gpu.hbm_gib < 80 and 139 < get_system("H200").gpu.hbm_gib < 141
    assert get_system("B300").scaleout_bw_gbs == 100


def test_unknown_system_suggests():
    with pytest.raises(UnknownNameError, match="closest"):
        get_system("DGX-H10")


GOOD_YAML = """
name: MyCluster-H100
aliases: [mine]
gpu:
  name: H100-SXM5-80GB
  arch: hopper
  sm_count: 132
  hbm_gib: 79.2
  hbm_bw_gbs: 3350
  peak_tflops: {bf16: 989, fp8: 1979}
gpus_per_node: 8
nvlink_domain: 8
nvlink_bw_gbs: 450
scaleout_bw_gbs: 25
host_cpu: 2x AMD EPYC 9654
sources: {scaleout: "our cluster: 4x 400G per 8 GPUs"}
"""


def test_custom_yaml(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text(GOOD_YAML)
    s = get_system(str(path))
    assert s.name == "MyCluster-H100" and s.scaleout_bw_gbs == 25
    assert load_system_file(path) == s


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("name: x\ngpu: [1, 2\n", "not valid YAML"),
        ("- just\n- a list\n", "expected a mapping"),
        (GOOD_YAML.replace("nvlink_domain: 8\n", ""), "nvlink_domain"),
        (GOOD_YAML.replace("  sm_count: 132\n", ""), "gpu.sm_count"),
        (GOOD_YAML.replace("arch: hopper", "arch: volta"), "gpu.arch"),
        (GOOD_YAML.replace("{bf16: 989, fp8: 1979}", "{fp8: 1979}"), "bf16"),
        (GOOD_YAML.replace("{bf16: 989, fp8: 1979}", "{bf16: 989, int8: 1979}"), "int8"),
        (GOOD_YAML + "colour: green\n", "colour"),
    ],
)
def test_custom_yaml_errors(tmp_path, text, needle):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(InputError, match=needle) as info:
        get_system(str(path))
    assert "\n" not in str(info.value)


def test_missing_file():
    with pytest.raises(InputError, match="no such system file"):
        get_system("/nonexistent/sys.yaml")


def test_cli_bad_system_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(GOOD_YAML.replace("nvlink_domain: 8\n", ""))
    res = run_cli("layout", "--gpus", "8", "--system", str(path), "--json")
    assert res.returncode == 2
    assert res.stdout == ""
    assert res.stderr.startswith("error:") and "nvlink_domain" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
