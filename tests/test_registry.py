"""Every declared op reaches every entry: the registries that make docs/extending.md's lists true.

A collective declared in ``trident.ccl.OPS`` must have a custom op (``torch.ops.trident``), a row in
``trident bench latency`` and a torch.distributed mapping (or a stated refusal); a fused op of
``trident.ops.OPS`` (and ``all_reduce_rmsnorm``) a custom op and a latency row.
"""

import pytest

from tests.conftest import get_pool
from trident import ccl, dist_backend, ops, torch_ops


def test_every_collective_has_a_custom_op_and_a_dist_backend_row():
    for name in ccl.OPS:
        assert name in torch_ops.SCHEMAS, f"collective {name} has no torch.ops.trident schema"
        assert name in dist_backend.COLLECTIVE_METHODS, f"collective {name} has no dist-backend row"
        method = dist_backend.COLLECTIVE_METHODS[name]
        assert method is None or callable(getattr(dist_backend.TridentProcessGroup, method)), (name, method)
    for name in (*ops.OPS, "all_reduce_rmsnorm"):
        assert name in torch_ops.SCHEMAS, f"fused op {name} has no torch.ops.trident schema"


def _latency_rows(ctx):
    from trident.bench import latency

    cases, keep = latency._host_cases(ctx, small_only=True)
    ctx.free(*keep)
    return [name for name, _, _ in cases]


@pytest.mark.parametrize("kind", ["collective", "fused op"])
def test_every_op_has_a_latency_row(kind):
    names = (get_pool(2).run(_latency_rows))[0]
    wanted = list(ccl.OPS) if kind == "collective" else [*ops.OPS, "all_reduce_rmsnorm"]
    for op in wanted:
        assert any(n.split(" ")[0] == op for n in names), f"{kind} {op} has no row in trident bench latency: {names}"
