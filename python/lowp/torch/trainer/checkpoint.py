"""The checkpoint file of the PyTorch trainer (lowp.torch.trainer): the C trainer's format.

One safetensors file (include/lowp/safetensors.h): an 8-byte little-endian header length, a
JSON header {"NAME": {"dtype", "shape", "data_offsets"}, "__metadata__": {KEY: VALUE}}, then
the tensors' bytes. Its checksums are those of the C trainer (src/trainer/checkpoint_check.c):

- ``__metadata__["crc32c.NAME"]``: the CRC-32C of tensor NAME's bytes, 8 lower-case hex digits,
  for every tensor (weights, AdamW moments and step counts, FP8 extra state, the RNG state);
- ``__metadata__["crc32c.__metadata__"]``: the CRC-32C over every other metadata entry in
  bytewise key order, each as KEY 0x00 VALUE 0x00 (the step, the data position, the recipe,
  the model and training settings are metadata).

This module owns the bytes: :func:`encode` and :func:`decode` (which checks the structure and
every checksum before it returns anything, with an error naming the tensor or the metadata),
the CRC-32C, and :func:`write_atomic` (a temporary file unique to the writer, fsync, rename,
fsync of the directory; the temporary file removed on any failure). With lowp's C extension
the checksums are verified by the C trainer's own checker (``lowp.checkpoint_verify``,
so both trainers share one checker) and computed by its CRC-32C; without it (a checkout
without ``make build``) by the Python port below, which gives the same answers, more slowly.

It also owns what a checkpoint of this trainer must hold before a run uses it:
:func:`read_checkpoint` (the format and version, each metadata field's type, the settings'
rules, the counters' ranges) and :func:`checked_state` (every tensor's name, shape, dtype and
values against the model). The trainer (``loop.Trainer.state`` / ``load``) writes and applies.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import struct

import torch

from .config import TrainConfig
from .model import MoEConfig

__all__ = ["CHECKPOINT_FORMAT", "CHECKPOINT_VERSION", "DTYPES", "META_CRC", "checked_state",
           "crc32c", "decode", "encode", "meta_crc", "read_checkpoint", "write_atomic"]

META_CRC = "crc32c.__metadata__"
DTYPES = {torch.float32: "F32", torch.float64: "F64", torch.float16: "F16",
          torch.bfloat16: "BF16", torch.uint8: "U8", torch.int8: "I8", torch.int32: "I32",
          torch.int64: "I64", torch.bool: "BOOL"}
_BY_NAME = {v: k for k, v in DTYPES.items()}
_SIZE = {n: torch.empty(0, dtype=d).element_size() for n, d in _BY_NAME.items()}
_HEADER_MAX = 100 << 20  # as the C reader's bound on a header


def _ext():
    """lowp (its public lowp.crc32c and lowp.checkpoint_verify) when its C extension is
    built, else None."""
    try:
        import lowp  # noqa: PLC0415
    except ImportError:  # no extension in this checkout
        return None
    return lowp


def _table() -> list:
    t = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
        t.append(c)
    return t


_TABLE: list | None = None


def crc32c_py(data, crc: int = 0) -> int:
    """CRC-32C (Castagnoli, reflected 0x82F63B78, init and final XOR 0xFFFFFFFF) of ``data``
    continued from ``crc``: the pure-Python port of src/io/crc32c.c (about 5 MB/s)."""
    global _TABLE
    if _TABLE is None:
        _TABLE = _table()
    t = _TABLE
    c = crc ^ 0xFFFFFFFF
    for b in bytes(data):
        c = t[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def crc32c(data, crc: int = 0) -> int:
    """CRC-32C of ``data`` (bytes-like) continued from ``crc``: the C library's when built."""
    ext = _ext()
    return ext.crc32c(data, crc) if ext is not None else crc32c_py(data, crc)


def meta_crc(meta: dict, crc=crc32c) -> int:
    """The metadata checksum: every entry but META_CRC, in bytewise key order, KEY\\0VALUE\\0."""
    c = 0
    for k in sorted((k for k in meta if k != META_CRC), key=lambda k: k.encode()):
        c = crc(k.encode() + b"\0" + meta[k].encode() + b"\0", c)
    return c


def _tensor_bytes(t: torch.Tensor) -> bytes:
    """A CPU tensor's elements, C order, little-endian (the host's order: x86, arm64)."""
    t = t.detach().contiguous().reshape(-1)
    return t.view(torch.uint8).numpy().tobytes() if t.numel() else b""


def encode(tensors: dict, meta: dict) -> bytes:
    """The file's bytes: ``tensors`` {name: CPU tensor} in that order, ``meta`` {key: str};
    the checksums are added here."""
    header, chunks, off = {}, [], 0
    meta = {str(k): str(v) for k, v in meta.items()}
    for name, t in tensors.items():
        if t.dtype not in DTYPES:
            raise TypeError(f"checkpoint: tensor {name!r} has dtype {t.dtype}, not one of "
                            f"{', '.join(map(str, DTYPES))}")
        b = _tensor_bytes(t)
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [off, off + len(b)]}
        meta["crc32c." + name] = f"{crc32c(b):08x}"
        chunks.append(b)
        off += len(b)
    meta[META_CRC] = f"{meta_crc(meta):08x}"
    header["__metadata__"] = meta
    h = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    return struct.pack("<Q", len(h)) + h + b"".join(chunks)


def _no_duplicates(pairs):
    d = {}
    for k, v in pairs:
        if k in d:
            raise ValueError(f"the header names {k!r} twice")
        d[k] = v
    return d


def _header(data: bytes, path: str):
    """(entries {name: (dtype, shape, begin, end)}, meta, data offset); ValueError if the
    structure is not a safetensors file's."""
    bad = f"checkpoint {path}: not a lowp checkpoint"
    if data[:4] == b"PK\x03\x04":
        raise ValueError(f"{bad} (a version 1 checkpoint, a torch.save pickle without "
                         "checksums, which this program no longer reads)")
    if len(data) < 8:
        raise ValueError(f"{bad} ({len(data)} bytes: truncated)")
    (n,) = struct.unpack_from("<Q", data, 0)
    if n < 2 or n > _HEADER_MAX or 8 + n > len(data):
        raise ValueError(f"{bad} (header length {n} does not fit its {len(data)} bytes)")
    try:
        h = json.loads(data[8:8 + n].decode(), object_pairs_hook=_no_duplicates)
    except (UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"{bad} (the header is not valid JSON: {e})") from None
    if not isinstance(h, dict):
        raise ValueError(f"{bad} (the header is not a JSON object)")
    meta = h.pop("__metadata__", None)
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise ValueError(f"checkpoint {path}: the metadata is missing or not strings")
    entries = {name: _entry(name, e, path) for name, e in h.items()}
    _coverage(entries, len(data) - 8 - n, path)
    return entries, meta, 8 + n


def _entry(name: str, e, path: str):
    what = f"checkpoint {path}: tensor '{name}'"
    if not isinstance(e, dict) or set(e) != {"dtype", "shape", "data_offsets"}:
        raise ValueError(f"{what}: malformed header entry")
    dt, shape, offs = e["dtype"], e["shape"], e["data_offsets"]
    if dt not in _BY_NAME:
        raise ValueError(f"{what}: unknown dtype {dt!r}")
    ints = (isinstance(shape, list) and isinstance(offs, list) and len(offs) == 2 and
            all(type(x) is int and x >= 0 for x in shape + offs))
    if not ints or len(shape) > 8:
        raise ValueError(f"{what}: malformed shape or data_offsets")
    nbytes = _SIZE[dt]
    for s in shape:
        nbytes *= s
    if offs[1] - offs[0] != nbytes:
        raise ValueError(f"{what}: data_offsets [{offs[0]}, {offs[1]}] hold {offs[1] - offs[0]} "
                         f"bytes, its shape {shape} x {dt} needs {nbytes}")
    return dt, tuple(shape), offs[0], offs[1]


def _coverage(entries: dict, data_len: int, path: str) -> None:
    at = 0
    for name, (_, _, b, e) in sorted(entries.items(), key=lambda kv: (kv[1][2], kv[1][3])):
        if b != at:
            raise ValueError(f"checkpoint {path}: tensor '{name}' at [{b}, {e}]: tensors overlap "
                             "or leave a gap")
        at = e
    if at != data_len:
        raise ValueError(f"checkpoint {path}: the tensors cover {at} of the {data_len} data "
                         "bytes (truncated or trailing bytes)")


def _stored(meta: dict, key: str, path: str) -> int:
    v = meta.get(key)
    if v is None:
        raise ValueError(f"checkpoint {path}: the checksum '{key}' is missing")
    if len(v) != 8 or any(c not in "0123456789abcdefABCDEF" for c in v):
        raise ValueError(f"checkpoint {path}: the checksum '{key}' ('{v[:20]}') is not 8 hex "
                         "digits")
    return int(v, 16)


def verify_py(entries: dict, meta: dict, body: memoryview, path: str) -> None:
    """The Python port of lowp_ckpt_verify: the metadata's checksum, then every tensor's."""
    want, got = _stored(meta, META_CRC, path), meta_crc(meta, crc32c_py)
    if got != want:
        raise ValueError(f"checkpoint {path}: the metadata fails its CRC-32C check (stored "
                         f"{want:08x}, computed {got:08x}): a setting was changed or damaged")
    for name, (_, _, b, e) in sorted(entries.items(), key=lambda kv: kv[1][2]):
        want, got = _stored(meta, "crc32c." + name, path), crc32c_py(body[b:e])
        if got != want:
            raise ValueError(f"checkpoint {path}: tensor '{name}' fails its CRC-32C check "
                             f"(stored {want:08x}, computed {got:08x})")


def decode(data: bytes, path: str = "<bytes>", use_c: bool | None = None):
    """``(tensors {name: CPU tensor}, meta {key: str})`` of a checkpoint's bytes, after the
    checks of the structure and of every checksum; ValueError naming the tensor or the
    metadata otherwise. ``use_c``: the C checker (default: when the extension is built)."""
    ext = _ext() if use_c is not False else None
    if use_c and ext is None:
        raise ValueError("decode: use_c=True, but lowp's C extension is not available")
    if ext is not None and data[:4] != b"PK\x03\x04":
        try:
            ext.checkpoint_verify(data, path)
        except ValueError as e:  # the parser's messages name "<memory>", not the file
            raise ValueError(str(e) if path in str(e) else f"checkpoint {path}: {e}") from None
    entries, meta, at = _header(data, path)
    body = memoryview(data)[at:]
    if ext is None:
        verify_py(entries, meta, body, path)
    tensors = {}
    for name, (dt, shape, b, e) in entries.items():
        t = torch.frombuffer(bytearray(body[b:e]), dtype=_BY_NAME[dt]) if e > b else \
            torch.empty(0, dtype=_BY_NAME[dt])
        tensors[name] = t.reshape(shape)
    meta = {k: v for k, v in meta.items() if not k.startswith("crc32c.")}
    return tensors, meta


def write_atomic(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically: PATH.tmp-PID-RANDOM (unique to this writer,
    created exclusively), fsync, rename to PATH, fsync of the directory. On any failure the
    temporary file is removed and PATH is what it was; the OSError propagates."""
    tmp = f"{path}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    dfd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


# ---- the checkpoint's values: what a checkpoint of this trainer holds, checked before use

# The checkpoint's format name: the command's name when the format was made (before the
# trainer moved to lowp.torch.trainer), kept so that earlier checkpoints still resume.
CHECKPOINT_FORMAT, CHECKPOINT_VERSION = "lowp.torch.train", 2


def _bad(path: str, name: str, what: str) -> ValueError:
    return ValueError(f"--resume {path}: tensor '{name}' {what}")


def _checked(tensors: dict, name: str, like: torch.Tensor, path: str, nonneg=False):
    """tensors[name], which must have ``like``'s shape and dtype and finite values (>= 0)."""
    t = tensors.get(name)
    if t is None:
        raise _bad(path, name, "is missing")
    if t.dtype != like.dtype or tuple(t.shape) != tuple(like.shape):
        raise _bad(path, name, f"is {t.dtype} {tuple(t.shape)}, the model's is {like.dtype} "
                               f"{tuple(like.shape)}")
    if t.is_floating_point():
        bad = ~torch.isfinite(t) | (t < 0) if nonneg else ~torch.isfinite(t)
        if bool(bad.any()):
            i = int(bad.reshape(-1).nonzero()[0])
            raise _bad(path, name, f"holds {float(t.reshape(-1)[i])} at element {i} (values "
                                   f"must be finite{' and >= 0' if nonneg else ''})")
    return t


def _checked_params(model, tensors: dict, path: str) -> dict:
    return {"params." + n: _checked(tensors, "params." + n, _plain_like(p), path)
            for n, p in model.named_parameters()}


def _plain_like(p: torch.Tensor) -> torch.Tensor:
    return torch.empty(p.shape, dtype=p.dtype, device="meta")


def _checked_moments(model, order: list, tensors: dict, step: int, path: str) -> dict:
    """The optimizer state {index: {step, exp_avg, exp_avg_sq}}: per parameter all three or
    none; moments of the parameter's shape and dtype, finite (exp_avg_sq >= 0); the step an
    integer in [0, the checkpoint's step] (an update skipped for a non-finite gradient does
    not count)."""
    named = dict(model.named_parameters())
    state = {}
    for i, n in enumerate(order):
        keys = [k for k in ("step", "exp_avg", "exp_avg_sq") if f"optim.{k}.{n}" in tensors]
        if not keys:
            continue
        like = _plain_like(named[n])
        s = {"exp_avg": _checked(tensors, f"optim.exp_avg.{n}", like, path),
             "exp_avg_sq": _checked(tensors, f"optim.exp_avg_sq.{n}", like, path, nonneg=True),
             "step": _checked(tensors, f"optim.step.{n}", torch.empty((), device="meta"), path)}
        v = float(s["step"])
        if not (v == int(v) and 0 <= v <= step):
            raise _bad(path, f"optim.step.{n}", f"is {v}, not an integer in [0, step {step}]")
        state[i] = s
    return state


def _checked_extra(mine: dict, tensors: dict, path: str) -> dict:
    out = {}
    for k, v in mine.items():
        t = tensors.get(k)
        if t is None:
            raise _bad(path, k, "is missing")
        if t.dtype != torch.uint8 or t.ndim != 1:
            raise _bad(path, k, f"is {t.dtype} {tuple(t.shape)}, not a uint8 blob")
        out[k] = t
    return out


def _checked_rng(tensors: dict, path: str) -> torch.Tensor:
    t = tensors.get("rng")
    like = torch.get_rng_state()
    if t is None or t.dtype != like.dtype or t.shape != like.shape:
        raise _bad(path, "rng", "is missing or is not a CPU generator state "
                                f"(uint8 {tuple(like.shape)})")
    try:
        torch.Generator().set_state(t)
    except RuntimeError as e:
        raise _bad(path, "rng", f"is not a valid generator state ({e})") from e
    return t


def _meta_value(meta: dict, key: str, typ, path: str):
    if key not in meta:
        raise ValueError(f"--resume {path}: metadata '{key}' is missing")
    try:
        v = json.loads(meta[key])
    except ValueError:
        v = None
    if typ is float and type(v) is int:
        v = float(v)
    if type(v) is not typ:
        raise ValueError(f"--resume {path}: metadata '{key}' ({meta[key][:40]!r}) is not "
                         f"a {typ.__name__}")
    return v


def _meta_philox(meta: dict, path: str):
    """The Philox stream positions {name: (seed, offset)} (lowp.torch.philox_states, the FP4
    recipes' SR and Hadamard signs), or None in a checkpoint written before they were kept."""
    if "philox" not in meta:
        return None
    v = _meta_value(meta, "philox", dict, path)
    ok = all(isinstance(k, str) and isinstance(p, list) and len(p) == 2 and
             all(type(i) is int and 0 <= i < 2 ** 64 for i in p) for k, p in v.items())
    if not ok:
        raise ValueError(f"--resume {path}: metadata 'philox' ({v!r}) is not "
                         "{name: [seed, offset]} of integers in [0, 2^64)")
    return {k: (p[0], p[1]) for k, p in v.items()}


def _meta_fields(meta: dict, prefix: str, cls, path: str) -> dict:
    types = {"int": int, "float": float, "bool": bool, "str": str}
    return {f.name: _meta_value(meta, f"{prefix}.{f.name}", types.get(str(f.type), f.type), path)
            for f in dataclasses.fields(cls)}


def read_checkpoint(path: str) -> dict:
    """A checkpoint's contents after the checks that need no model: the file's structure and
    every checksum (checkpoint.decode), the format and version, each field's type, the
    settings (TrainConfig.check, MoEConfig.check) and the counters' ranges. Returns
    {"step", "data_pos", "recipe", "model_seed", "data_name", "data_hash", "config": {...},
    "train": {...}, "tensors": {name: tensor}}; ValueError naming the field otherwise."""
    with open(path, "rb") as f:
        data = f.read()
    tensors, meta = decode(data, path)
    if meta.get("format") != json.dumps(CHECKPOINT_FORMAT):
        raise ValueError(f"--resume {path}: not a {CHECKPOINT_FORMAT} checkpoint")
    if meta.get("version") != json.dumps(CHECKPOINT_VERSION):
        raise ValueError(f"--resume {path}: version {meta.get('version')}, this program reads "
                         f"{CHECKPOINT_VERSION}")
    ck = {k: _meta_value(meta, k, t, path) for k, t in (
        ("step", int), ("data_pos", int), ("recipe", str), ("model_seed", int),
        ("data_name", str), ("data_hash", int))}
    ck["philox"] = _meta_philox(meta, path)
    ck["config"] = _meta_fields(meta, "config", MoEConfig, path)
    ck["train"] = _meta_fields(meta, "train", TrainConfig, path)
    try:
        MoEConfig(**ck["config"]).check()
        TrainConfig(**ck["train"]).check()
    except ValueError as e:
        raise ValueError(f"--resume {path}: the checkpoint's settings: {e}") from e
    if not 0 <= ck["step"] <= ck["train"]["steps"]:
        raise ValueError(f"--resume {path}: metadata 'step' ({ck['step']}) is outside [0, "
                         f"train.steps {ck['train']['steps']}]")
    if not 0 <= ck["data_pos"] < 2 ** 62:
        raise ValueError(f"--resume {path}: metadata 'data_pos' ({ck['data_pos']}) is negative "
                         "or too large")
    ck["tensors"] = tensors
    return ck


# ---- sampling (as lowp_sample_text)


def checked_state(tensors: dict, model, order: list, extra_like: dict, step: int, path: str):
    """``(params, optimizer state, extra states, rng)`` from a checkpoint's ``tensors``,
    checked against ``model`` (its parameters, ``order``: their names in the optimizer's
    index order; ``extra_like``: the model's extra states; ``step``: the checkpoint's):
    every expected tensor present with the right shape and dtype and finite values, and no
    other tensor. ValueError naming the first tensor refused."""
    params = _checked_params(model, tensors, path)
    opt_state = _checked_moments(model, order, tensors, step, path)
    extra = _checked_extra(extra_like, tensors, path)
    rng = _checked_rng(tensors, path)
    known = set(params) | set(extra) | {"rng"} | {
        f"optim.{k}.{n}" for i, n in enumerate(order) for k in opt_state.get(i, {})}
    unknown = sorted(set(tensors) - known)
    if unknown:
        raise ValueError(f"--resume {path}: tensor '{unknown[0]}' is not one of this "
                         "model's")
    return params, opt_state, extra, rng
