"""Worker of test_param_swap_dist.py: trains a prepared MLP on 2 gloo processes (DDP or FSDP2)
and on one process with the same global batch; writes what the test compares to a file."""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import lowp.torch as lt

STEPS = 4
GLOBAL_BATCH = 64
RECIPES = ("bf16", "all_mxfp8", "fp8_delayed")


def make_model(recipe):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64))
    if recipe == "bf16":
        # every weight through lowp's BF16 GEMMs (the plain bf16 path of the param swap)
        lt.apply_recipe(m, "bf16", rules=[("*", "bf16")])
    else:
        lt.apply_recipe(m, recipe)
    return m


def data(step):
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(GLOBAL_BATCH, 64, generator=g)
    return x, torch.tanh(x) * 0.5


def train(model, rank, world, steps=STEPS):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    per = GLOBAL_BATCH // world
    for step in range(steps):
        x, y = data(step)
        x, y = x[rank * per:(rank + 1) * per], y[rank * per:(rank + 1) * per]
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        loss = loss.detach().clone()
        if world > 1:
            dist.all_reduce(loss)
            loss /= world
        losses.append(float(loss))
    return losses


def _scales(model):
    return torch.cat([st.scales for _, st in lt.fp8_states(model)])


def single(recipe):
    m = make_model(recipe)
    losses = train(m, 0, 1)
    return losses


def worker(rank, world, port, mode, out_dir):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    result = {}
    try:
        for recipe in RECIPES:
            m = make_model(recipe)
            if mode == "ddp":
                from torch.nn.parallel import DistributedDataParallel as DDP

                model = DDP(m)
            else:
                from torch.distributed.device_mesh import init_device_mesh
                from torch.distributed.fsdp import fully_shard

                mesh = init_device_mesh("cpu", (world,))
                for layer in (m[0], m[2]):
                    fully_shard(layer, mesh=mesh)
                fully_shard(m, mesh=mesh)
                model = m
            losses = train(model, rank, world)
            r = {"losses": losses}
            if recipe == "fp8_delayed":
                s = _scales(m)
                gathered = [torch.zeros_like(s) for _ in range(world)]
                dist.all_gather(gathered, s)
                r["scales"] = [g.tolist() for g in gathered]
                r["updates"] = [st.updates for _, st in lt.fp8_states(m)]
            if mode == "fsdp":
                w = m[0].weight
                local = getattr(w, "_local_tensor", None)
                r["sharded_type"] = type(local).__name__
                r["local_shape"] = list(local.shape) if local is not None else None
                r["quantizations"] = _unsharded_quantizations(m)
                if recipe == "all_mxfp8":
                    r["dcp"] = _sharded_checkpoint(m, recipe, mesh, out_dir, world, rank)
            result[recipe] = r
        if rank == 0:
            torch.save(result, os.path.join(out_dir, "%s.pt" % mode))
    finally:
        dist.destroy_process_group()


def _unsharded_quantizations(m):
    """Quantized copies made of the unsharded (all-gathered) weights: proof that the wrapper
    came back after the all-gather and the matmuls ran through lowp."""
    return int(lt.stats().get("native", 0) + lt.stats().get("portable", 0))


def _sharded_checkpoint(m, recipe, mesh, out_dir, world, rank):
    """Save the sharded state dict with torch.distributed.checkpoint and load it into a fresh
    sharded model; True when every local shard came back equal."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.fsdp import fully_shard

    path = os.path.join(out_dir, "dcp_" + recipe)
    sd = m.state_dict()
    dcp.save(sd, checkpoint_id=path)
    m2 = make_model(recipe)
    for layer in (m2[0], m2[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(m2, mesh=mesh)
    sd2 = m2.state_dict()
    dcp.load(sd2, checkpoint_id=path)
    m2.load_state_dict(sd2)
    ok = True
    for (n, a), (_, b) in zip(m.state_dict().items(), m2.state_dict().items()):
        la = a.to_local() if hasattr(a, "to_local") else a
        lb = b.to_local() if hasattr(b, "to_local") else b
        la = la.master if isinstance(la, lt.LowpWeight) else la
        lb = lb.master if isinstance(lb, lt.LowpWeight) else lb
        ok = ok and torch.equal(la, lb)
    still_wrapped = isinstance(getattr(m2[0].weight, "_local_tensor", None), lt.LowpWeight)
    return bool(ok and still_wrapped)
