"""The machine's GPUs and what links them: NVML (nvidia-ml-py's ``pynvml``) for NVLink / PCIe,
torch for peer access. What ``trident info`` prints.

:mod:`trident.platform` describes the one device a rank runs on; this module lists every GPU
of the machine, whichever rank (if any) uses it.

Everything here degrades: without ``pynvml`` or without a GPU the functions say so instead of
failing, so ``trident info`` and the benchmarks' metadata work on any machine.

Example::

    for row in gpu_rows():
        print(row["index"], row["name"], row["sms"])
"""

from __future__ import annotations

from platform import python_version

import torch
import triton

from . import config
from .platform import PROCESS_BACKEND, gpus_visible


def _nvml():
    """The initialized ``pynvml`` module, or ``None`` with the reason."""
    try:
        import pynvml
    except ImportError:
        return None, "pynvml (nvidia-ml-py) is not installed: pip install nvidia-ml-py"
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # no driver, no GPU
        return None, f"NVML unavailable: {exc}"
    return pynvml, ""


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def driver_version() -> str | None:
    """The NVIDIA driver version from NVML, or ``None`` when NVML is unavailable."""
    nvml, _ = _nvml()
    if nvml is None:
        return None
    try:
        return _text(nvml.nvmlSystemGetDriverVersion())
    except Exception:
        return None


def _pci(info) -> tuple:
    """(domain, bus, device) of an NVML PCI info struct."""
    return (int(info.domain), int(info.bus), int(info.device))


def _link(nvml, handles, i: int, j: int) -> str:
    """How GPU ``i`` reaches GPU ``j``: ``NVLink xN``, ``PCIe (...)`` or ``?``."""
    try:  # NVLink: count the active links of i whose remote end is j
        target = _pci(nvml.nvmlDeviceGetPciInfo(handles[j]))
        links = 0
        for link in range(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18)):
            try:
                if nvml.nvmlDeviceGetNvLinkState(handles[i], link) != nvml.NVML_FEATURE_ENABLED:
                    continue
                if _pci(nvml.nvmlDeviceGetNvLinkRemotePciInfo(handles[i], link)) == target:
                    links += 1
            except Exception:
                continue
        if links:
            return f"NVLink x{links}"
    except Exception:
        pass
    try:
        level = nvml.nvmlDeviceGetTopologyCommonAncestor(handles[i], handles[j])
        names = {nvml.NVML_TOPOLOGY_INTERNAL: "same board", nvml.NVML_TOPOLOGY_SINGLE: "PCIe switch",
                 nvml.NVML_TOPOLOGY_MULTIPLE: "PCIe switches", nvml.NVML_TOPOLOGY_HOSTBRIDGE: "PCIe host bridge",
                 nvml.NVML_TOPOLOGY_NODE: "PCIe, same NUMA node", nvml.NVML_TOPOLOGY_SYSTEM: "PCIe, across CPUs"}
        return f"PCIe ({names.get(level, level)})"
    except Exception:
        return "?"


def _handles(nvml, n: int) -> list:
    """NVML handles in torch's device order (which CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER
    may make differ from NVML's), matched by PCI address; by index when torch has none."""
    by_pci = {}
    for k in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(k)
        by_pci[_pci(nvml.nvmlDeviceGetPciInfo(handle))] = handle
    handles = []
    for i in range(n):
        p = torch.cuda.get_device_properties(i)
        key = (getattr(p, "pci_domain_id", None), getattr(p, "pci_bus_id", None), getattr(p, "pci_device_id", None))
        handles.append(by_pci.get(key) or nvml.nvmlDeviceGetHandleByIndex(i))
    return handles


def peer_matrix() -> dict:
    """The links between every pair of visible GPUs and whether CUDA peer access works.

    Returns:
        ``{"gpus": n, "links": [[str]], "peer_access": [[bool]], "nvml": "" or why not}``; the
        diagonal says ``same GPU``. ``links`` cells are ``"n/a"`` without NVML.

    Example::

        m = peer_matrix()
        print(m["links"][0][1], m["peer_access"][0][1])      # NVLink x18 True
    """
    n = gpus_visible()
    nvml, why = _nvml() if n else (None, "no GPU")
    handles = []
    if nvml is not None:
        try:
            handles = _handles(nvml, n)
        except Exception as exc:
            nvml, why = None, f"NVML could not match the GPUs: {exc}"
    links = [["same GPU" if i == j else (_link(nvml, handles, i, j) if nvml else "n/a") for j in range(n)]
             for i in range(n)]
    access = [[i == j or bool(torch.cuda.can_device_access_peer(i, j)) for j in range(n)] for i in range(n)]
    return {"gpus": n, "links": links, "peer_access": access, "nvml": why}


def gpu_rows() -> list[dict]:
    """One dict per visible GPU: index, name, SMs, memory (MiB), compute capability.

    Example::

        gpu_rows()   # [{"index": 0, "name": "NVIDIA H200", "sms": 132, "memory_mib": 143771, "capability": "9.0"}]
    """
    rows = []
    for i in range(gpus_visible()):
        p = torch.cuda.get_device_properties(i)
        rows.append({"index": i, "name": p.name, "sms": p.multi_processor_count, "memory_mib": p.total_memory >> 20,
                     "capability": f"{p.major}.{p.minor}"})
    return rows


def system_info(default_heap_size: int, version: str) -> dict:
    """Everything ``trident info`` prints: a summary, the GPUs and the peer matrix.

    Args:
        default_heap_size: bytes per rank that ``trident.init()`` allocates by default (the
            runtime owns it: ``trident.runtime.context.DEFAULT_HEAP_SIZE``).
        version: trident's version (``trident.__version__``).

    Returns:
        ``{"summary": {label: text}, "gpus": [gpu_rows()], "peers": peer_matrix()}``.

    Example::

        facts = system_info(DEFAULT_HEAP_SIZE, trident.__version__)
        print(facts["summary"]["backend"])     # "sim (CPU simulator: ..., no GPU visible)"
    """
    gpus = gpu_rows()
    nvml, why = _nvml() if gpus else (None, "")
    backend = PROCESS_BACKEND
    if backend == "sim":
        backend += " (CPU simulator: kernels run in Triton's interpreter" + (
            ", chosen with TRIDENT_BACKEND)" if gpus else ", no GPU visible)")
    summary = {
        "backend": backend, "debug": str(config.DEBUG), "trident": version, "torch": torch.__version__,
        "triton": triton.__version__, "cuda (torch)": str(torch.version.cuda),
        "driver": driver_version() or ("n/a: " + why if why else "n/a (no GPU)"),
        "python": python_version(),
        "gpus": f"{len(gpus)}" + (f" x {gpus[0]['name']}, {gpus[0]['sms']} SMs" if gpus else " (none visible)"),
        "heap size default": f"{default_heap_size >> 20} MiB per rank (trident.init(heap_size=...))",
        "nvml": "ok" if nvml is not None else (why or "not needed (no GPU)"),
    }
    return {"summary": summary, "gpus": gpus, "peers": peer_matrix()}
