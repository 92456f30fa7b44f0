"""``trident info`` and the topology probe: on a CPU-only machine, without pynvml, and with a fake NVML."""

import json
import sys
import types

import pytest
import torch

import trident
from trident import topology
from trident.cli import main

cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="checks what a CPU-only machine prints")


@cpu_only
def test_info_on_cpu_says_simulator(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "backend" in out and "sim (CPU simulator" in out and "no GPU visible" in out
    assert "heap size default  1024 MiB" in out and "triton" in out and "gpus               0" in out


@cpu_only
def test_info_json(capsys):
    assert main(["info", "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)
    assert facts["gpus"] == [] and facts["peers"]["gpus"] == 0 and facts["peers"]["links"] == []
    assert facts["summary"]["backend"].startswith("sim")


def test_missing_pynvml_is_reported(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml now raises ImportError
    nvml, why = topology._nvml()
    assert nvml is None and "nvidia-ml-py" in why
    assert topology.driver_version() is None
    monkeypatch.setattr(topology, "gpu_rows", lambda: [{"index": 0, "name": "Fake GPU", "sms": 132,
                                                         "memory_mib": 1, "capability": "9.0"}])
    summary = topology.system_info(1 << 30, trident.__version__)["summary"]
    assert "not installed" in summary["nvml"] and "not installed" in summary["driver"]
    assert summary["gpus"].startswith("1 x Fake GPU, 132 SMs")
    assert summary["heap size default"].startswith("1024 MiB") and summary["trident"] == trident.__version__


def _fake_nvml():
    """GPU 0 has two NVLinks to GPU 1 and one to GPU 2; GPUs 1 and 2 meet under a PCIe host bridge."""
    pci = {h: types.SimpleNamespace(domain=0, bus=0x10 * (h + 1), device=0) for h in range(3)}
    remote = {0: [1, 1, 2, None], 1: [], 2: []}
    nv = types.SimpleNamespace(
        NVML_FEATURE_ENABLED=1, NVML_NVLINK_MAX_LINKS=4, NVML_TOPOLOGY_INTERNAL=0, NVML_TOPOLOGY_SINGLE=10,
        NVML_TOPOLOGY_MULTIPLE=20, NVML_TOPOLOGY_HOSTBRIDGE=30, NVML_TOPOLOGY_NODE=40, NVML_TOPOLOGY_SYSTEM=50)
    nv.nvmlDeviceGetPciInfo = lambda h: pci[h]
    nv.nvmlDeviceGetNvLinkState = lambda h, link: int(link < len(remote[h]) and remote[h][link] is not None)

    def remote_pci(h, link):
        return pci[remote[h][link]]

    nv.nvmlDeviceGetNvLinkRemotePciInfo = remote_pci
    nv.nvmlDeviceGetTopologyCommonAncestor = lambda a, b: 30
    return nv


def test_link_kinds_from_nvml():
    nv = _fake_nvml()
    handles = [0, 1, 2]
    assert topology._link(nv, handles, 0, 1) == "NVLink x2"
    assert topology._link(nv, handles, 0, 2) == "NVLink x1"
    assert topology._link(nv, handles, 1, 2) == "PCIe (PCIe host bridge)"
