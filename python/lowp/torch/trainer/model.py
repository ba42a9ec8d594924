"""The MoE transformer of ``lowp train`` in PyTorch, with torchtitan's DeepSeek module names.

    tok_embeddings -> L x [ attention_norm -> causal attention with RoPE -> + ;
                            ffn_norm -> MoE (shared SwiGLU expert + top-k routed SwiGLU
                            experts) -> + ] -> norm -> output -> cross-entropy

It mirrors the C model of ``include/lowp/model.h`` closely, so that C and PyTorch runs of the
same configuration compare: the same presets (``tiny``, ``small``, ``medium``), the same
initialization (N(0, 0.02) drawn from Philox4x32-10 words through Box-Muller in float64, in the
C model's parameter order, ``wo`` and ``w2`` scaled by 1/sqrt(2 L), norm weights 1), the same
router (softmax over all experts in float32, top-k, gates renormalized over the chosen ones),
the same load-balancing loss (E * sum_e f_e P_e, averaged over layers) and the same loss
(mean cross-entropy + aux_loss_coef * that). Activations are float32 throughout, as in C.

Matmuls whose weight is a plain tensor run in ``plain_dtype`` (bfloat16 by default: the inputs
are rounded to bfloat16, torch's own CPU kernels multiply them), as the C model's unwrapped
linears run BF16 GEMMs. A weight that is a tensor subclass (lowp's param-swap wrapper, or
torchao's training weight wrapper) receives the float32 activations unchanged through
``F.linear`` / ``torch._grouped_mm``, so that its own ``__torch_function__`` decides the
numerics.

    model = MoETransformer(MoEConfig.preset("small", vocab=65), seed=1234)
    loss, ce, aux = model(tokens, targets)          # tokens, targets: int64 [B, T]

Parameter names (``model.named_parameters()``):

    tok_embeddings.weight                    [V, D]
    layers.N.attention_norm.weight           [D]
    layers.N.attention.wq|wk|wv|wo.weight    [D, D]
    layers.N.ffn_norm.weight                 [D]
    layers.N.moe.router.gate.weight          [E, D]
    layers.N.moe.shared_experts.w1|w3.weight [H_s, D]   w2.weight [D, H_s]
    layers.N.moe.experts.w1|w3               [E, H, D]  w2        [E, D, H]
    norm.weight                              [D]
    output.weight                            [V, D]
"""

from __future__ import annotations

import contextlib
import dataclasses
import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import lowp.torch as lt

__all__ = ["MoEConfig", "MoETransformer", "PRESETS", "philox_words"]

# name: (dim, layers, heads, seq_len, experts, top_k, expert_hidden, shared_hidden), as
# lowp_moe_config_preset in src/model/moe.c.
PRESETS = {
    "tiny": (64, 2, 4, 32, 4, 2, 64, 64),
    "small": (128, 4, 4, 64, 8, 2, 128, 128),
    "medium": (384, 6, 6, 256, 8, 2, 512, 512),
}


@dataclasses.dataclass
class MoEConfig:
    vocab: int
    dim: int = 64
    layers: int = 2
    heads: int = 4
    seq_len: int = 32
    experts: int = 4
    top_k: int = 2
    expert_hidden: int = 64
    shared_hidden: int = 64
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    aux_loss_coef: float = 0.01
    dropout: float = 0.0

    @classmethod
    def preset(cls, name: str, vocab: int, **overrides) -> "MoEConfig":
        if name not in PRESETS:
            raise ValueError(f"config: {name!r} is not a preset ({', '.join(PRESETS)})")
        d, l, h, t, e, k, hid, sh = PRESETS[name]
        cfg = cls(vocab, d, l, h, t, e, k, hid, sh)
        for key, value in overrides.items():
            if not hasattr(cfg, key):
                raise ValueError(f"config: unknown field {key!r}")
            setattr(cfg, key, value)
        cfg.check()
        return cfg

    def check(self) -> None:
        for f in ("vocab", "dim", "layers", "heads", "seq_len", "experts", "top_k",
                  "expert_hidden", "shared_hidden"):
            v = getattr(self, f)
            if not isinstance(v, int) or v <= 0:
                raise ValueError(f"config.{f} ({v!r}) must be a positive integer")
        if self.dim % self.heads or (self.dim // self.heads) % 2:
            raise ValueError(f"config.dim ({self.dim}) / config.heads ({self.heads}) must be a "
                             "whole, even head width (RoPE rotates pairs)")
        if self.top_k > self.experts:
            raise ValueError(f"config.top_k ({self.top_k}) > config.experts ({self.experts})")
        if not (self.rope_theta > 1 and math.isfinite(self.rope_theta)):
            raise ValueError(f"config.rope_theta ({self.rope_theta}) must be > 1")
        if not (self.norm_eps > 0 and math.isfinite(self.norm_eps)):
            raise ValueError(f"config.norm_eps ({self.norm_eps}) must be > 0")
        if not (self.aux_loss_coef >= 0 and math.isfinite(self.aux_loss_coef)):
            raise ValueError(f"config.aux_loss_coef ({self.aux_loss_coef}) must be >= 0")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"config.dropout ({self.dropout}) must be in [0, 1)")

    def describe(self) -> str:
        return (f"dim {self.dim}, {self.layers} layers, {self.heads} heads, seq_len "
                f"{self.seq_len}, {self.experts} experts (top-{self.top_k}, hidden "
                f"{self.expert_hidden}), shared hidden {self.shared_hidden}, vocabulary "
                f"{self.vocab}, dropout {self.dropout:g}")


# ---------------------------------------------------------------- Philox (src/core/philox.h)

_M0, _M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
_W0, _W1 = 0x9E3779B9, 0xBB67AE85
_LO = np.uint64(0xFFFFFFFF)


def philox_words(seed: int, offset: int, n: int) -> np.ndarray:
    """Words offset .. offset + n - 1 of the Philox4x32-10 stream ``seed`` (uint32 [n]): word j
    is lane j % 4 of the block whose counter is (j / 4, 0, 0, 0) and key the seed's halves, as
    lowp_philox_word in C."""
    if n <= 0:
        return np.zeros(0, dtype=np.uint32)
    b0, b1 = offset >> 2, (offset + n - 1) >> 2
    blocks = np.arange(b0, b1 + 1, dtype=np.uint64)
    c0 = blocks & _LO
    c1 = blocks >> np.uint64(32)
    c2 = np.zeros_like(c0)
    c3 = np.zeros_like(c0)
    k0, k1 = seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF
    for _ in range(10):
        p0 = _M0 * c0
        p1 = _M1 * c2
        n0 = (p1 >> np.uint64(32)) ^ c1 ^ np.uint64(k0)
        n2 = (p0 >> np.uint64(32)) ^ c3 ^ np.uint64(k1)
        c1 = p1 & _LO
        c3 = p0 & _LO
        c0, c2 = n0, n2
        k0 = (k0 + _W0) & 0xFFFFFFFF
        k1 = (k1 + _W1) & 0xFFFFFFFF
    lanes = np.stack([c0, c1, c2, c3], axis=1).reshape(-1).astype(np.uint32)
    first = offset - (b0 << 2)
    return lanes[first:first + n]


def _init_normal(n: int, std: float, seed: int, base: int) -> np.ndarray:
    """N(0, std) as init_normal in src/model/moe.c: words base + 2p and base + 2p + 1 give the
    radius and the angle of elements 2p (cosine) and 2p + 1 (sine), in float64."""
    m = (n + 1) // 2 * 2
    w = philox_words(seed, base, m).astype(np.float64)
    u1 = (w[0::2] + 0.5) / 4294967296.0
    angle = 6.283185307179586 * (w[1::2] / 4294967296.0)
    r = std * np.sqrt(-2.0 * np.log(u1))
    out = np.empty(m, dtype=np.float64)
    out[0::2] = r * np.cos(angle)
    out[1::2] = r * np.sin(angle)
    return out[:n].astype(np.float32)


# ---------------------------------------------------------------- building blocks


def _is_plain(w: torch.Tensor) -> bool:
    return type(w) in (torch.Tensor, nn.Parameter)


def _linear(x: torch.Tensor, w: torch.Tensor, plain_dtype) -> torch.Tensor:
    """y [M, N] float32 = x [M, K] . w [N, K]^T."""
    if not _is_plain(w):
        return F.linear(x, w).float()
    if plain_dtype is None or plain_dtype == x.dtype:
        return F.linear(x, w)
    return F.linear(x.to(plain_dtype), w.to(plain_dtype)).float()


def _grouped(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor, plain_dtype) -> torch.Tensor:
    """y [S, N] = per group g: x[rows of g] . w[g]^T, w [G, N, K] (torch._grouped_mm on the
    transposed view, as torchtitan's GroupedExperts)."""
    if not _is_plain(w):
        return torch._grouped_mm(x, w.transpose(-2, -1), offs=offs).float()
    if plain_dtype is None or plain_dtype == x.dtype:
        return torch._grouped_mm(x, w.transpose(-2, -1), offs=offs)
    y = torch._grouped_mm(x.to(plain_dtype), w.to(plain_dtype).transpose(-2, -1), offs=offs)
    return y.float()


def _autocast_off(device_type: str):
    """A context with autocast off for ``device_type`` (nothing to do when it is off)."""
    if torch.amp.is_autocast_available(device_type) and torch.is_autocast_enabled(device_type):
        return torch.autocast(device_type, enabled=False)
    return contextlib.nullcontext()


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * weight, computed in float32 (the C trainer runs it
    without autocast); returned in lowp's autocast dtype (``lowp.torch.autocast_dtype``: the
    autocast dtype of x's device type when autocast is enabled there, else x's dtype)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        odt = lt.autocast_dtype(x.device.type, x.dtype)
        with _autocast_off(x.device.type):
            y = F.rms_norm(x.float(), (x.shape[-1],), self.weight.float(), self.eps)
        return y.to(odt)


class Attention(nn.Module):
    def __init__(self, cfg: MoEConfig):
        super().__init__()
        d = cfg.dim
        self.heads = cfg.heads
        self.wq = nn.Linear(d, d, bias=False)
        self.wk = nn.Linear(d, d, bias=False)
        self.wv = nn.Linear(d, d, bias=False)
        self.wo = nn.Linear(d, d, bias=False)

    def forward(self, h, B, T, cos, sin, plain_dtype):
        """h [N, D] -> [N, D]; cos, sin [T, hd / 2]."""
        N, D = h.shape
        nh, hd = self.heads, D // self.heads

        def heads(t, rotate):
            t = t.view(B, T, nh, hd // 2, 2)
            if rotate:  # pair (2i, 2i + 1) turns by t * theta^(-2i / hd)
                a, b = t[..., 0], t[..., 1]
                c, s = cos[:, None, :], sin[:, None, :]
                t = torch.stack((a * c - b * s, a * s + b * c), dim=-1)
            return t.view(B, T, nh, hd).transpose(1, 2)  # [B, nh, T, hd]

        q = heads(_linear(h, self.wq.weight, plain_dtype), True)
        k = heads(_linear(h, self.wk.weight, plain_dtype), True)
        v = heads(_linear(h, self.wv.weight, plain_dtype), False)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # float32, as C
        o = o.transpose(1, 2).reshape(N, D)
        return _linear(o, self.wo.weight, plain_dtype)


class FeedForward(nn.Module):
    """SwiGLU: (silu(x W1^T) * (x W3^T)) W2^T."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x, plain_dtype):
        u1 = _linear(x, self.w1.weight, plain_dtype)
        u3 = _linear(x, self.w3.weight, plain_dtype)
        return _linear(F.silu(u1) * u3, self.w2.weight, plain_dtype)


class GroupedExperts(nn.Module):
    """E routed SwiGLU experts as 3-D weights, run through torch._grouped_mm over the
    expert-sorted token slots."""

    def __init__(self, dim: int, hidden: int, experts: int):
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(experts, hidden, dim))
        self.w2 = nn.Parameter(torch.empty(experts, dim, hidden))
        self.w3 = nn.Parameter(torch.empty(experts, hidden, dim))

    def forward(self, xp, offs, plain_dtype):
        u1 = _grouped(xp, self.w1, offs, plain_dtype)
        u3 = _grouped(xp, self.w3, offs, plain_dtype)
        return _grouped(F.silu(u1) * u3, self.w2, offs, plain_dtype)


class TokenChoiceTopKRouter(nn.Module):
    def __init__(self, dim: int, experts: int, top_k: int):
        super().__init__()
        self.top_k = top_k
        self.gate = nn.Linear(dim, experts, bias=False)

    def forward(self, h, plain_dtype):
        """-> probs [N, E] (softmax in float32), idx [N, K] (most probable first), gate [N, K]
        (the chosen probabilities renormalized to sum 1)."""
        probs = torch.softmax(_linear(h, self.gate.weight, plain_dtype).float(), dim=-1)
        top, idx = torch.topk(probs, self.top_k, dim=-1)
        return probs, idx, top / top.sum(dim=-1, keepdim=True)


class MoE(nn.Module):
    def __init__(self, cfg: MoEConfig):
        super().__init__()
        self.experts_n, self.top_k = cfg.experts, cfg.top_k
        self.router = TokenChoiceTopKRouter(cfg.dim, cfg.experts, cfg.top_k)
        self.experts = GroupedExperts(cfg.dim, cfg.expert_hidden, cfg.experts)
        self.shared_experts = FeedForward(cfg.dim, cfg.shared_hidden)

    def forward(self, h, plain_dtype):
        """h [N, D] -> (y [N, D], aux: E * sum_e f_e P_e)."""
        N = h.shape[0]
        E, K = self.experts_n, self.top_k
        probs, idx, gate = self.router(h, plain_dtype)
        flat = idx.reshape(-1)  # slot n * K + j
        counts = torch.bincount(flat, minlength=E)
        frac = counts.float() / flat.numel()  # f_e: a count, no gradient
        aux = E * (frac * probs.mean(dim=0)).sum()
        # Slots sorted by expert, tokens in order within an expert (as dispatch in C).
        order = torch.argsort(flat, stable=True)
        offs = torch.cumsum(counts, 0).to(torch.int32)
        xp = h.index_select(0, order // K)
        eo = self.experts(xp, offs, plain_dtype)  # [S, D] in expert order
        pos = torch.empty_like(order)
        pos[order] = torch.arange(order.numel(), device=order.device)
        routed = eo.index_select(0, pos).view(N, K, -1)
        y = self.shared_experts(h, plain_dtype) + (routed * gate.unsqueeze(-1)).sum(dim=1)
        return y, aux


class TransformerBlock(nn.Module):
    def __init__(self, cfg: MoEConfig):
        super().__init__()
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.moe = MoE(cfg)
        self.dropout = cfg.dropout

    def forward(self, x, B, T, cos, sin, plain_dtype):
        a = self.attention(self.attention_norm(x), B, T, cos, sin, plain_dtype)
        x = x + F.dropout(a, self.dropout, self.training)
        m, aux = self.moe(self.ffn_norm(x), plain_dtype)
        return x + F.dropout(m, self.dropout, self.training), aux


class MoETransformer(nn.Module):
    """The model. ``plain_dtype``: the dtype the matmuls of plain (unwrapped) weights run in
    (``torch.bfloat16``, as the C model; ``torch.float32`` or None: float32)."""

    def __init__(self, cfg: MoEConfig, seed: int = 1234, plain_dtype=torch.bfloat16):
        super().__init__()
        cfg.check()
        self.cfg = cfg
        self.plain_dtype = plain_dtype
        self.activation_checkpoint = False  # recompute each layer in the backward
        self.tok_embeddings = nn.Embedding(cfg.vocab, cfg.dim)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(cfg) for i in range(cfg.layers)})
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab, bias=False)
        half = cfg.dim // cfg.heads // 2
        t = np.arange(cfg.seq_len, dtype=np.float64)[:, None]
        i = np.arange(half, dtype=np.float64)[None, :]
        angle = t * np.power(float(np.float32(cfg.rope_theta)), -i / half)
        self.register_buffer("rope_cos", torch.from_numpy(np.cos(angle).astype(np.float32)),
                             persistent=False)
        self.register_buffer("rope_sin", torch.from_numpy(np.sin(angle).astype(np.float32)),
                             persistent=False)
        self.init_weights(seed)

    def c_order(self):
        """(name, parameter, initial std or None for ones) in the C model's parameter order,
        which fixes each parameter's Philox words."""
        L = self.cfg.layers
        std, std_out = 0.02, float(np.float32(0.02) / np.sqrt(np.float32(2.0 * L), dtype=np.float32))
        out = [("tok_embeddings.weight", std)]
        for l in range(L):
            p = f"layers.{l}."
            out += [(p + "attention_norm.weight", None)]
            out += [(p + f"attention.{w}.weight", std) for w in ("wq", "wk", "wv")]
            out += [(p + "attention.wo.weight", std_out), (p + "ffn_norm.weight", None),
                    (p + "moe.router.gate.weight", std),
                    (p + "moe.shared_experts.w1.weight", std),
                    (p + "moe.shared_experts.w3.weight", std),
                    (p + "moe.shared_experts.w2.weight", std_out),
                    (p + "moe.experts.w1", std), (p + "moe.experts.w3", std),
                    (p + "moe.experts.w2", std_out)]
        out += [("norm.weight", None), ("output.weight", std)]
        params = dict(self.named_parameters())
        assert len(params) == len(out), (sorted(params), [n for n, _ in out])
        return [(n, params[n], s) for n, s in out]

    @torch.no_grad()
    def init_weights(self, seed: int) -> None:
        """The C model's initialization for ``seed`` (lowp_moe_create)."""
        word = 0
        for _, p, std in self.c_order():
            n = p.numel()
            if std is None:
                p.fill_(1.0)
            else:
                p.copy_(torch.from_numpy(_init_normal(n, float(np.float32(std)), seed, word))
                        .view(p.shape))
            word += (n + 15) // 16 * 16

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None):
        """tokens [B, T] -> logits [B * T, V] without targets, else (loss, cross-entropy, aux)
        with loss = cross-entropy + aux_loss_coef * aux (aux: the mean over layers)."""
        B, T = tokens.shape
        if not 1 <= T <= self.cfg.seq_len:
            raise ValueError(f"tokens: T ({T}) must be in [1, seq_len = {self.cfg.seq_len}]")
        pd = self.plain_dtype
        x = self.tok_embeddings(tokens.reshape(-1))
        cos, sin = self.rope_cos[:T], self.rope_sin[:T]
        aux = x.new_zeros(())
        ckpt = self.activation_checkpoint and self.training and torch.is_grad_enabled()
        for layer in self.layers.values():
            if ckpt:
                x, a = torch.utils.checkpoint.checkpoint(layer, x, B, T, cos, sin, pd,
                                                         use_reentrant=False)
            else:
                x, a = layer(x, B, T, cos, sin, pd)
            aux = aux + a
        aux = aux / self.cfg.layers
        logits = _linear(self.norm(x), self.output.weight, pd).float()
        if targets is None:
            return logits
        ce = F.cross_entropy(logits, targets.reshape(-1))
        return ce + self.cfg.aux_loss_coef * aux, ce, aux

    def flops_per_token(self, T: int) -> float:
        """Training FLOPs of one token: 6 x the active GEMM parameters + attention, as
        lowp_moe_flops_per_token."""
        c = self.cfg
        total = sum(p.numel() for p in self.parameters())
        active = total - c.layers * (c.experts - c.top_k) * 3 * c.expert_hidden * c.dim
        return 6.0 * (active - c.vocab * c.dim) + 12.0 * c.layers * c.dim * T
