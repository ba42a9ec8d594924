"""A small MoE transformer trained with lowp's `mix` recipe through the param swap.

The model follows torchtitan's DeepSeek naming (`layers.N.attention.*`,
`layers.N.moe.shared_experts.*`, `layers.N.moe.experts.*`, `layers.N.moe.router.*`); its routed
experts are 3-D parameters run by `torch._grouped_mm`. `apply_recipe(model, "mix")` wraps the
attention and shared-expert weights in MXFP8 and the routed experts in the NPU's Block FP8
(32x32 E8M0 weights, MX activations); embeddings, router, norms and the output head stay high
precision. Nothing else in the training loop changes.

    PYTHONPATH=python python examples/torch/moe_mix_recipe.py [--steps N]
"""

import argparse
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import lowp.torch as lt


class Attention(nn.Module):
    def __init__(self, dim, n_heads):
        super().__init__()
        self.n_heads = n_heads
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, dim, bias=False)
        self.wv = nn.Linear(dim, dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        B, T, D = x.shape
        h = self.n_heads

        def heads(t):
            return t.view(B, T, h, D // h).transpose(1, 2)

        q, k, v = heads(self.wq(x)), heads(self.wk(x)), heads(self.wv(x))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(B, T, D))


class FeedForward(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class GroupedExperts(nn.Module):
    """Routed experts as 3-D weights ([E, hidden, dim] like torchtitan), run by _grouped_mm."""

    def __init__(self, dim, hidden, n_experts):
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(n_experts, hidden, dim))
        self.w2 = nn.Parameter(torch.empty(n_experts, dim, hidden))
        self.w3 = nn.Parameter(torch.empty(n_experts, hidden, dim))
        for w in (self.w1, self.w2, self.w3):
            nn.init.normal_(w, std=w.shape[-1] ** -0.5)

    def forward(self, x, offs):
        x = x.to(self.w1.dtype)  # torch._grouped_mm multiplies operands of one dtype
        h = F.silu(torch._grouped_mm(x, self.w1.transpose(-2, -1), offs=offs))
        h = h * torch._grouped_mm(x, self.w3.transpose(-2, -1), offs=offs)
        return torch._grouped_mm(h, self.w2.transpose(-2, -1), offs=offs)


class Router(nn.Module):
    def __init__(self, dim, n_experts, top_k):
        super().__init__()
        self.gate = nn.Linear(dim, n_experts, bias=False)
        self.top_k = top_k

    def forward(self, x):
        scores = torch.softmax(self.gate(x).float(), dim=-1)
        top, idx = scores.topk(self.top_k, dim=-1)
        return top / top.sum(-1, keepdim=True), idx


class MoE(nn.Module):
    def __init__(self, dim, hidden, n_experts, top_k):
        super().__init__()
        self.n_experts = n_experts
        self.router = Router(dim, n_experts, top_k)
        self.experts = GroupedExperts(dim, hidden, n_experts)
        self.shared_experts = FeedForward(dim, hidden)

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        weights, idx = self.router(x)
        flat = idx.reshape(-1)
        order = torch.argsort(flat, stable=True)
        token = order // idx.shape[1]
        counts = torch.bincount(flat, minlength=self.n_experts)
        offs = torch.cumsum(counts, 0).to(torch.int32)
        y = self.experts(x[token], offs)
        w = weights.reshape(-1)[order].to(y.dtype)
        out = torch.zeros_like(x, dtype=y.dtype).index_add_(0, token, y * w[:, None])
        return (out + self.shared_experts(x)).reshape(shape)


class Block(nn.Module):
    def __init__(self, dim, n_heads, hidden, n_experts, top_k):
        super().__init__()
        self.attention_norm = lt.RMSNorm(dim)
        self.attention = Attention(dim, n_heads)
        self.ffn_norm = lt.RMSNorm(dim)
        self.moe = MoE(dim, hidden, n_experts, top_k)

    def forward(self, x):
        x = x + self.attention(self.attention_norm(x))
        return x + self.moe(self.ffn_norm(x))


class TinyMoE(nn.Module):
    def __init__(self, vocab=64, dim=64, n_layers=2, n_heads=2, hidden=64, n_experts=4, top_k=2):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(
            Block(dim, n_heads, hidden, n_experts, top_k) for _ in range(n_layers))
        self.norm = lt.RMSNorm(dim)
        self.output = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens):
        x = self.tok_embeddings(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.output(self.norm(x))


def batch(step, batch_size=8, seq=32, vocab=64, seed=0):
    """A fixed synthetic language: each sequence is an arithmetic progression modulo vocab with
    a random start and stride, so the next token is predictable from the previous two."""
    g = torch.Generator().manual_seed(seed * 100003 + step)
    start = torch.randint(0, vocab, (batch_size, 1), generator=g)
    stride = torch.randint(1, 8, (batch_size, 1), generator=g)
    seqs = (start + stride * torch.arange(seq + 1)) % vocab
    return seqs[:, :-1], seqs[:, 1:]


def train(model, steps, lr=3e-3, seed=0, autocast=True):
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    losses = []
    for step in range(steps):
        x, y = batch(step, seed=seed)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = model(x)
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    model = TinyMoE()
    wrapped = lt.apply_recipe(model, "mix", verbose=True)
    kinds = {type(c).__name__ for c in wrapped.values()}
    assert kinds == {"MXQuantizeConfig", "BlockQuantizeConfig"}, kinds
    for fqn, cfg in wrapped.items():
        routed = ".moe.experts." in fqn
        assert isinstance(cfg, lt.BlockQuantizeConfig) == routed, (fqn, cfg)
    losses = train(model, args.steps)
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    print("loss: first 5 steps %.4f, last 5 steps %.4f" % (first, last))
    if not last < 0.8 * first:
        print("FAIL: the loss did not fall", file=sys.stderr)
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
