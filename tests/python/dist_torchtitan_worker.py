"""Worker of test_torchtitan_patch.py: FSDP2 over gloo, two ranks, after torchtitan's own
`disable_fsdp_gradient_division` (gradient divide factor 1.0, which makes FSDP2 reduce-scatter
with PREMUL_SUM). Each rank writes its sharded weight gradient, or the error, to OUT/rank.pt."""

import os
import traceback

import torch
import torch.distributed as dist


def worker(rank, world, port, out, patched):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        from torch.distributed.fsdp import fully_shard
        import torchtitan.distributed.fsdp as tt_fsdp
        from lowp.torch.patches import patch_torchtitan
        if patched:
            patch_torchtitan()
        torch.manual_seed(0)
        model = torch.nn.Linear(8, 4, bias=False)
        fully_shard(model)
        tt_fsdp.disable_fsdp_gradient_division(model)  # looked up where apply_fsdp does
        g = torch.Generator().manual_seed(1 + rank)
        x = torch.randn(3, 8, generator=g)
        model(x).square().sum().backward()
        res = {"grad": model.weight.grad.full_tensor()}
    except Exception as e:  # reported to the test, which decides
        res = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()}
    torch.save(res, os.path.join(out, f"{rank}.pt"))
    dist.destroy_process_group()
