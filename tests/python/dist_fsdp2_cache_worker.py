"""Worker of test_fsdp2_cache.py (issue 39): a small model whose every matmul weight runs in
MXFP8 through one of lowp's three cached paths, trained for a few SGD steps, with or without
FSDP2 (`fully_shard`, gloo), torchtitan's layout: activation checkpointing inside each
sharded layer, two micro-batches per step.

Kinds:
- "torchao": `lowp.torch.patch_torchao()` and torchao's own MXFP8 recipe
  (`MXFP8TrainingOpConfig.from_recipe(MXFP8_RCEIL)`) on the linear and the experts;
- "functional": `lowp.torch.linear` / `grouped_mm` with a `WeightCache` per weight;
- "swap": the param swap (`apply_recipe(model, "all_mxfp8")`).
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import lowp.torch as lt

KINDS = ("torchao", "functional", "swap")
STEPS, MICRO, BATCH, LR = 4, 2, 64, 2.0
DM, DH, E = 64, 128, 4
BF = torch.bfloat16


class Inner(nn.Module):
    def __init__(self, kind, g):
        super().__init__()
        self.kind = kind
        self.lin = nn.Linear(DM, DH, bias=False).to(BF)
        self.w = nn.Parameter((torch.randn(E, DM, DH, generator=g) * 0.1).to(BF))
        with torch.no_grad():
            self.lin.weight.copy_(torch.randn(DH, DM, generator=g) * 0.1)
        if kind == "functional":
            self.caches = (lt.WeightCache(), lt.WeightCache())

    def forward(self, x):
        t = x.shape[0]
        offs = torch.tensor([t // 4, t // 4, 3 * t // 4, t], dtype=torch.int32)  # one empty
        if self.kind == "functional":
            h = lt.linear(x, self.lin.weight, None, "mxfp8", cache=self.caches[0])
            y = lt.grouped_mm(F.gelu(h), self.w.transpose(-2, -1), offs, "mxfp8",
                              cache=self.caches[1])
        else:
            h = F.linear(x, self.lin.weight)
            y = torch._grouped_mm(F.gelu(h), self.w.transpose(-2, -1), offs=offs)
        return x + y.to(x.dtype)


class Layer(nn.Module):
    """torchtitan's order: checkpoint inside, fully_shard outside."""

    def __init__(self, kind, g):
        super().__init__()
        self.inner = Inner(kind, g)

    def forward(self, x):
        return checkpoint(self.inner, x, use_reentrant=False)


def make_model(kind):
    g = torch.Generator().manual_seed(7)
    m = nn.Sequential(Layer(kind, g), Layer(kind, g))
    if kind == "torchao":
        from torchao.prototype.moe_training.config import (MXFP8TrainingOpConfig,
                                                           MXFP8TrainingRecipe)
        from torchao.quantization import quantize_

        lt.patch_torchao()
        quantize_(m, MXFP8TrainingOpConfig.from_recipe(MXFP8TrainingRecipe.MXFP8_RCEIL),
                  filter_fn=lambda mod, fqn: isinstance(mod, (nn.Linear, Inner)))
    elif kind == "swap":
        lt.apply_recipe(m, "all_mxfp8")
    return m


def data():
    g = torch.Generator().manual_seed(11)
    x = torch.randn(BATCH, DM, generator=g).to(BF)
    return x, torch.tanh(x.float()).to(BF)


def train(model, rank=0, world=1, ranks=None):
    """Losses (global mean) of STEPS SGD steps on one fixed batch split over the ranks and
    into MICRO micro-batches each: a run that reuses step 1's quantized weights repeats its
    loss. `ranks`: one process standing in for these ranks without FSDP2 (their micro-batches
    accumulate, each rank's loss weighted 1/len(ranks) as FSDP2's gradient mean does)."""
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    xs, ys = data()
    per = BATCH // world
    ranks = [rank] if ranks is None else list(ranks)
    losses = []
    for _ in range(STEPS):
        total = torch.zeros(())
        for r in ranks:
            x, y = xs[r * per:(r + 1) * per], ys[r * per:(r + 1) * per]
            for xm, ym in zip(x.chunk(MICRO), y.chunk(MICRO)):
                loss = F.mse_loss(model(xm).float(), ym.float()) / (MICRO * len(ranks))
                loss.backward()
                total += loss.detach()
        opt.step()
        opt.zero_grad()
        if world > 1 and len(ranks) == 1:
            dist.all_reduce(total)
            total /= world
        losses.append(float(total))
    return losses


def shard(m, world):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    for layer in m:
        fully_shard(layer, mesh=mesh)
    fully_shard(m, mesh=mesh)
    return m


def run(kind, rank=0, world=1, fsdp=True, keep=None):
    """Losses of `train` on a fresh model of `kind`: sharded with FSDP2 over `world` ranks, or
    (fsdp False) one process standing in for all `world` ranks. `keep` (a list) gets the
    model."""
    m = make_model(kind)
    if keep is not None:
        keep.append(m)
    try:
        if fsdp:
            return train(shard(m, world), rank, world)
        return train(m, 0, world, ranks=range(world))
    finally:
        if kind == "torchao":
            lt.unpatch_torchao()


def worker(rank, world, port, out_dir):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        result = {kind: run(kind, rank, world) for kind in KINDS}
        if rank == 0:
            torch.save(result, os.path.join(out_dir, "fsdp2_cache.pt"))
    finally:
        dist.destroy_process_group()
