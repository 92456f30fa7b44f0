"""Past one node (issue 19): logical nodes on one machine (TRIDENT_NODES), in the simulator.

Ranks of different logical nodes never map each other's heaps, as on separate hosts. The
collectives and the split fused ops run hierarchically (trident inside a node, torch.distributed
between nodes) and must give the flat results; what cannot cross nodes is refused clearly.
"""

import pytest
import torch
import triton
import triton.language as tl

import trident
from tests.conftest import get_pool

LAYOUTS = [pytest.param(4, id="2nodes_x2"), pytest.param(6, id="2nodes_x3")]


def nodes_pool(world_size, **env):
    """A pool of ``world_size`` ranks in two logical nodes."""
    return get_pool(world_size, TRIDENT_NODES="2", **env)


def _layout(ctx):
    ctx.device_barrier()  # across nodes: the node's barrier, torch.distributed between, the node's again
    seed = ctx.broadcast(torch.full((2,), float(ctx.rank)), src=ctx.world_size - 1)
    return (ctx.node, ctx.local_rank, ctx.nodes, ctx.heap_bases_host, ctx.spans_nodes, repr(ctx), seed.tolist())


@pytest.mark.parametrize("world", LAYOUTS)
def test_every_rank_knows_its_node_and_maps_only_its_node(world):
    per = world // 2
    for rank, (node, local, nodes, bases, spans, text, seed) in enumerate(nodes_pool(world).run(_layout)):
        assert (node, local, spans, seed) == (rank // per, rank % per, True, [float(world - 1)] * 2)
        assert nodes == (tuple(range(per)), tuple(range(per, world)))
        assert [b != 0 for b in bases] == [r // per == node for r in range(world)]
        assert f"2 nodes x {per} ranks" in text and f"node {node}, local rank {local}" in text


def test_a_rank_pool_takes_logical_nodes():
    from trident.testing import RankPool

    assert RankPool(4, nodes=2).env == {"TRIDENT_NODES": "2"} and RankPool(4).env == {}


def _collectives(ctx):

    w, r = ctx.world_size, ctx.rank
    got = {}
    with torch.device(ctx.device):  # plain tensors on the rank's device
        for _ in range(2):
            _collective_round(ctx, w, r, got)
    return got


def _collective_round(ctx, w, r, got):
    """One call of each collective into ``got`` (the second round may take cached paths: the same results)."""
    import trident

    x = torch.arange(7, dtype=torch.int32) * (r + 1)  # 7: not a multiple of any node's size
    got["all_reduce"] = trident.ccl.all_reduce(ctx, x).tolist()
    y = ctx.full((5,), float(r))
    got["all_reduce_max"] = trident.ccl.all_reduce(ctx, y, op="max").tolist()
    got["all_gather"] = trident.ccl.all_gather(ctx, torch.empty(w * 3), torch.full((3,), float(r))).tolist()
    inp = torch.arange(w * 2, dtype=torch.int64) * (r + 1)
    got["reduce_scatter"] = trident.ccl.reduce_scatter(ctx, torch.empty(2, dtype=torch.int64), inp).tolist()
    send = (r * 100 + torch.arange(w)).repeat_interleave(2).view(w * 2, 1).expand(w * 2, 3).contiguous()
    got["all_to_all"] = trident.ccl.all_to_all(ctx, torch.empty_like(send), send)[:, 0].tolist()
    b = torch.full((4,), float(r))
    got["broadcast"] = trident.ccl.broadcast(ctx, b, src=w - 1).tolist()
    sizes = [(r + p) % 2 + 1 for p in range(w)]  # what I send to p; p sends me the same count
    rows = torch.cat([torch.full((n, 2), r * 100 + p) for p, n in enumerate(sizes)])
    got["all_to_all_v"] = trident.ccl.all_to_all_v(ctx, torch.empty(sum(sizes), 2, dtype=rows.dtype), rows,
                                                   out_splits=sizes, in_splits=sizes)[:, 0].tolist()


@pytest.mark.parametrize("world", LAYOUTS)
def test_every_collective_across_two_nodes_gives_the_flat_result(world):
    total = sum(range(1, world + 1))
    for r, got in enumerate(nodes_pool(world).run(_collectives)):
        assert got["all_reduce"] == [i * total for i in range(7)]
        assert got["all_reduce_max"] == [float(world - 1)] * 5
        assert got["all_gather"] == [float(p) for p in range(world) for _ in range(3)]
        assert got["reduce_scatter"] == [(2 * r + i) * total for i in range(2)]
        assert got["all_to_all"] == [p * 100 + r for p in range(world) for _ in range(2)]
        assert got["broadcast"] == [float(world - 1)] * 4
        assert got["all_to_all_v"] == [p * 100 + r for p in range(world) for _ in range((r + p) % 2 + 1)]


@triton.jit
def _store_kernel(x_ptr, rank, peer, heap_bases, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    trident.store(x_ptr + offs, offs + 1, rank, peer, heap_bases)


def _touch_other_node(ctx):
    x = ctx.zeros(8, dtype=torch.int32)
    ctx.barrier()
    peer = (ctx.rank + len(ctx.nodes[0])) % ctx.world_size  # the same local rank, in the other node
    try:
        _store_kernel[(1,)](x, ctx.rank, peer, ctx.heap_bases, BLOCK=8)
        ctx.check()
        message = "no error"
    except Exception as exc:  # the simulator raises in the launch, a GPU in check()
        message = f"{type(exc).__name__}: {exc}"
    ctx.barrier()
    return message, peer, ctx.heap_offset(x)


def test_a_device_access_to_another_nodes_heap_is_a_clear_error_in_debug_mode():
    for rank, (message, peer, offset) in enumerate(nodes_pool(4, TRIDENT_DEBUG="1").run(_touch_other_node)):
        assert message.startswith(f"DeviceError: rank {rank}: access to peer {peer} at heap offset "), message
        assert "is in another node" in message and f"heap_bases[{peer}] == 0" in message, message
        assert int(message.split("heap offset ")[1].split(" ")[0], 16) >= offset


def _groups_and_peers(ctx):
    import trident

    other = ctx.nodes[1 - ctx.node]
    refused = trident.testing.refusals({
        "mixed": lambda: ctx.new_group([0, ctx.world_size - 1]),
        "peer_view": lambda: ctx.peer_view(ctx.zeros(4), other[0]),
    })
    # A group inside each node works as on one node.
    mine = [g for g in (ctx.new_group(ranks) for ranks in ctx.nodes) if g is not None][0]
    x = torch.full((3,), float(ctx.rank), device=ctx.device)
    trident.ccl.all_reduce(ctx, x, group=mine)
    return refused, x.tolist()


def test_groups_live_in_one_node_and_mixed_ones_are_refused():
    for rank, (refused, x) in enumerate(nodes_pool(4).run(_groups_and_peers)):
        assert "span nodes" in refused["mixed"] and "torch.distributed group" in refused["mixed"], refused
        assert "is in another node" in refused["peer_view"], refused
        assert x == [float(sum(range(2)) if rank < 2 else 2 + 3)] * 3


def _fused(ctx):

    w, r, gen = ctx.world_size, ctx.rank, torch.Generator().manual_seed(7)
    A = [torch.randn(2 * w, 8, generator=gen).to(ctx.device) for _ in range(w)]  # every rank's A (K sharded)
    B = [torch.randn(8, 4, generator=gen).to(ctx.device) for _ in range(w)]
    with torch.device(ctx.device):
        return _fused_on_device(ctx, w, r, A, B)


def _fused_on_device(ctx, w, r, A, B):
    import trident

    rs = trident.ops.gemm_reduce_scatter(ctx, A[r], B[r], torch.empty(2, 4), pattern="fused_sequential")
    ag = trident.ops.all_gather_gemm(ctx, A[r][:2].contiguous(), B[r], torch.empty(2 * w, 4),
                                     pattern="fused_sequential")
    ar = trident.ops.gemm_all_reduce(ctx, A[r], B[r], torch.empty(2 * w, 4), pattern="bulk_synchronous")
    total = sum(a @ b for a, b in zip(A, B))
    gathered = torch.cat([a[:2] for a in A]) @ B[r]
    refused = trident.testing.refusals({
        "gemm_all_scatter": lambda: trident.ops.gemm_all_scatter(ctx, A[r], B[r], torch.empty(2 * w, 4 * w)),
        "moe_dispatch": lambda: trident.ops.moe_dispatch(ctx, torch.zeros(2, 4), torch.zeros(2, 1, dtype=torch.int64),
                                                         num_experts=w, max_tokens_per_rank=2),
    })
    scale = total.abs().max().item()  # relative errors: a GPU runs fp32 GEMMs in TF32
    return [(rs - total[2 * r:2 * r + 2]).abs().max().item() / scale, (ag - gathered).abs().max().item() / scale,
            (ar - total).abs().max().item() / scale], refused


@pytest.mark.parametrize("world,nodes", [(4, 2), (6, 2), (6, 3)], ids=["2nodes_x2", "2nodes_x3", "3nodes_x2"])
def test_the_split_fused_ops_across_nodes_give_the_flat_result(world, nodes):
    # Three nodes: the overlapped steps (one node's blocks at a time) in a non-trivial order.
    for errors, refused in get_pool(world, TRIDENT_NODES=str(nodes)).run(_fused):
        assert max(errors) < 5e-3, errors
        for name, message in refused.items():
            assert f"trident.ops.{name} does not run across nodes" in message, message
            assert "gemm_reduce_scatter, all_gather_gemm, gemm_all_reduce" in message, message


_SCRIPT = """
import torch, trident
ctx = trident.init(heap_size=1 << 24)
x = torch.full((3,), float(ctx.rank), device=ctx.device)
trident.ccl.all_reduce(ctx, x)
print(f"rank {ctx.rank} node {ctx.node} local {ctx.local_rank} sum {x[0].item():g}", flush=True)
ctx.close()
"""


def test_trident_run_splits_the_ranks_into_logical_nodes(tmp_path, capsys):
    import subprocess
    import sys

    from tests.conftest import script_env
    from trident import cli

    script = tmp_path / "nodes.py"
    script.write_text(_SCRIPT)
    done = subprocess.run([sys.executable, "-m", "trident", "run", "-n", "4", "--nodes", "2", str(script)],
                          env=script_env(), capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    lines = sorted(line for line in done.stdout.splitlines() if line.startswith("rank "))
    assert lines == [f"rank {r} node {r // 2} local {r % 2} sum 6" for r in range(4)], done.stdout
    # Refused before any rank starts (an argument check): in this process, as tests/test_launcher.py checks
    # `trident run`'s other bad arguments, rather than by starting a launcher to print it.
    with pytest.raises(SystemExit) as refused:
        cli.main(["run", "-n", "3", "--nodes", "2", str(script)])
    assert refused.value.code != 0 and "--nodes 2 must be at least 1 and divide -n 3" in capsys.readouterr().err


def _through_the_host(ctx):
    from trident.runtime.nodes import CrossNodes

    w, r = ctx.world_size, ctx.rank
    world = CrossNodes(None, shares_gpu=True)  # as when logical nodes share one GPU: gloo, host copies
    x = torch.full((3,), r + 0.5, dtype=torch.bfloat16, device=ctx.device)
    world.all_reduce(x)
    shard = torch.empty(2, dtype=torch.float16, device=ctx.device)
    world.reduce_scatter(shard, torch.arange(2 * w, dtype=torch.float16, device=ctx.device))
    gathered = torch.empty(w, dtype=torch.int32, device=ctx.device)
    world.all_gather(gathered, torch.tensor([r * 10], dtype=torch.int32, device=ctx.device))
    swapped = torch.empty(w, dtype=torch.int64, device=ctx.device)
    world.all_to_all(swapped, r * 100 + torch.arange(w, device=ctx.device))
    b = torch.full((2,), float(r), device=ctx.device)
    world.broadcast(b, src=w - 1)
    return x.tolist(), shard.tolist(), gathered.tolist(), swapped.tolist(), b.tolist()


def test_a_torch_group_whose_ranks_share_a_gpu_runs_through_the_host():
    # NCCL refuses two ranks on one GPU: logical nodes on one machine take gloo through host copies.
    w = 3
    for r, (x, shard, gathered, swapped, b) in enumerate(get_pool(w).run(_through_the_host)):
        assert x == [sum(p + 0.5 for p in range(w))] * 3  # bf16 summed in fp32 on the host
        assert shard == [float(w * (2 * r + i)) for i in range(2)]
        assert gathered == [p * 10 for p in range(w)] and swapped == [p * 100 + r for p in range(w)]
        assert b == [float(w - 1)] * 2


def _uneven_all_to_all_v(ctx):
    import trident

    w, r = ctx.world_size, ctx.rank

    def count(src, dst):  # rows src sends dst: 0 to 3, zeros included
        return (src * 7 + dst * 3) % 4

    buf = ctx.empty(w * 3, 2, dtype=torch.int64)  # the same capacity everywhere; a slice is sent
    rows = [torch.tensor([[r * 1000 + p * 10 + i, p] for i in range(count(r, p))], dtype=torch.int64).view(-1, 2)
            for p in range(w)]
    inp = buf[:sum(count(r, p) for p in range(w))]
    inp.copy_(torch.cat(rows).to(ctx.device))
    out = torch.empty(sum(count(p, r) for p in range(w)), 2, dtype=torch.int64, device=ctx.device)
    trident.ccl.all_to_all_v(ctx, out, inp, out_splits=[count(p, r) for p in range(w)],
                             in_splits=[count(r, p) for p in range(w)])
    return out.cpu().tolist()


@pytest.mark.parametrize("world,nodes", [(4, 2), (6, 3)], ids=["2nodes_x2", "3nodes_x2"])
def test_all_to_all_v_across_nodes_with_uneven_and_empty_splits(world, nodes):
    for r, got in enumerate(get_pool(world, TRIDENT_NODES=str(nodes)).run(_uneven_all_to_all_v)):
        want = [[p * 1000 + r * 10 + i, r] for p in range(world) for i in range((p * 7 + r * 3) % 4)]
        assert got == want, (r, got, want)
