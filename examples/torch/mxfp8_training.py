"""Prepare, train and convert a small MLP with MXFP8 weights through torchao's quantize_.

    PYTHONPATH=python python examples/torch/mxfp8_training.py [--steps N]

`quantize_(model, ParamSwapConfig(weight_config=MXQuantizeConfig()))` wraps every nn.Linear
weight; the training loop is plain PyTorch (AdamW, gradient clipping); every forward, input-
gradient and weight-gradient GEMM of those layers runs in MXFP8 on lowp's kernels. Convert gives
plain nn.Parameters holding exactly the trained master weights.
"""

import argparse
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torchao.quantization import quantize_

import lowp.torch as lt
from lowp.torch import MXQuantizeConfig, ParamSwapConfig


def make_task(n=512, d_in=64, d_out=32, seed=0):
    """A fixed regression task: y = tanh(x A) B + noise."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d_in, generator=g)
    a = torch.randn(d_in, 64, generator=g) / d_in ** 0.5
    b = torch.randn(64, d_out, generator=g) / 8.0
    y = torch.tanh(x @ a) @ b + 0.01 * torch.randn(n, d_out, generator=g)
    return x, y


def make_model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 128), nn.GELU(),
                         nn.Linear(128, 32))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60)
    args = ap.parse_args(argv)
    x, y = make_task()
    model = make_model()
    quantize_(model, ParamSwapConfig(weight_config=MXQuantizeConfig()))  # prepare
    wrapped = [n for n, _ in lt.wrapped_parameters(model)]
    print("wrapped:", ", ".join(wrapped))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for step in range(args.steps):
        i = torch.arange(step * 64, step * 64 + 64) % x.shape[0]
        loss = F.mse_loss(model(x[i]), y[i])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if step % 20 == 0 or step == args.steps - 1:
            print("step %3d  loss %.5f" % (step, losses[-1]))
    masters = {n: p.master.clone() for n, p in lt.wrapped_parameters(model)}
    quantize_(model, ParamSwapConfig(weight_config=MXQuantizeConfig(), step="convert"))
    params = dict(model.named_parameters())
    same = all(type(params[n]) is nn.Parameter and torch.equal(params[n].view(torch.int32),
                                                                m.view(torch.int32))
               for n, m in masters.items())
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    print("loss: first 5 steps %.5f, last 5 steps %.5f; converted weights bit-identical: %s" %
          (first, last, same))
    if not same or not last < 0.5 * first:
        print("FAIL", file=sys.stderr)
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
