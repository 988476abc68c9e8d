#!/usr/bin/python3
"""Records Spillway traces (spillway-trace v1, docs/trace-format.md) of PyTorch models.

The model runs from its ordinary PyTorch definition on the `meta` device (shapes and
dtypes, no data, no GPU) under a dispatch-mode recorder. Each aten op that launches work
becomes a `kernel` event with the storages it reads and writes:
  * writes = the op's outputs and the arguments its schema marks as mutated (in-place, out=);
    reads = every other tensor argument; a view is recorded as [id, offset, bytes] of its storage;
  * view ops (every output aliases an input, none written) and empty-tensor factories
    launch nothing;
  * `alloc` comes at a storage's first appearance; `free` right after its last use unless
    the storage is still alive when recording ends (weights, optimizer state);
  * dur_ns is a roofline: max(FLOPs / peak FLOP/s, bytes moved / memory bandwidth, floor).
    FLOPs are counted for matrix products (mm, addmm, bmm, baddbmm) and convolutions
    (forward, and backward per output asked for); bytes moved = the bytes of every tensor
    argument and output. Defaults are H200 SXM figures (NVIDIA H200 datasheet): dense TF32
    tensor-core 494.7 TFLOP/s (989 with sparsity), dense BF16/FP16 989 TFLOP/s, HBM3e
    4.8 TB/s; floor 4 us per kernel (launch + tail, our choice).
Ops without a meta kernel in this torch version (convolution backward) get their output
shapes from the recorder itself.

    scripts/trace_torch.py gpt2-xl-train  OUT.jsonl.gz [--batch 16 --seq 1024 --iters 3]
    scripts/trace_torch.py gpt2-xl-infer  OUT.jsonl.gz [--batch 48 --seq 1024 --decode 32]
    scripts/trace_torch.py resnet50-train OUT.jsonl.gz [--batch 512 --iters 3]
    scripts/trace_torch.py llama-train    OUT.jsonl.gz [--size 1b|3b --batch 8 --seq 1024 --iters 3]

Needs Debian's python3-torch and python3-torchvision (scripts/bootstrap-traces).
"""
import argparse
import gzip
import json
import math
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

META = torch.device("meta")


class Roofline:
    def __init__(self, flops_fp32, flops_half, bandwidth, floor_ns):
        self.flops_fp32, self.flops_half, self.bandwidth, self.floor_ns = flops_fp32, flops_half, bandwidth, floor_ns

    def ns(self, flops, nbytes, dtype):
        peak = self.flops_half if dtype in (torch.float16, torch.bfloat16) else self.flops_fp32
        return max(self.floor_ns, flops / peak * 1e9, nbytes / self.bandwidth * 1e9)


def nbytes_of(t):
    return t.numel() * t.element_size()


def matmul_flops(func, args, out):
    name = func.overloadpacket.__name__
    if name in ("mm", "addmm", "bmm", "baddbmm"):
        a, b = (args[0], args[1]) if name in ("mm", "bmm") else (args[1], args[2])
        return 2 * a.numel() * b.shape[-1]  # (.., m, k) @ (.., k, n): 2 m k n per batch
    return 0


def conv_flops(out_shape, weight, groups):
    # 2 * N * Cout * spatial_out * (Cin / groups) * kernel_elems
    n, cout = out_shape[0], out_shape[1]
    spatial = math.prod(out_shape[2:])
    return 2 * n * cout * spatial * (weight.shape[1]) * math.prod(weight.shape[2:])


class Recorder(TorchDispatchMode):
    """Records aten ops on meta tensors as kernels over storage ids."""

    def __init__(self, roofline):
        super().__init__()
        self.roofline = roofline
        self.refs = {}      # cdata -> (StorageWeakRef, id, nbytes)
        self.next_id = 0
        self.events = []    # ("kernel", name, dur, reads, writes) | ("iter", n)
        self.kinds = {}     # id -> kind

    def sid(self, t, kind="activation"):
        st = t.storage()
        ref = StorageWeakRef(st)
        entry = self.refs.get(ref.cdata)
        if entry is None or entry[0].expired():
            entry = (ref, self.next_id, max(1, st.nbytes()))
            self.refs[ref.cdata] = entry
            self.kinds[self.next_id] = kind
            self.next_id += 1
        return entry

    def ranges(self, tensors):
        out = []
        for t in tensors:
            if not isinstance(t, torch.Tensor) or t.device != META or t.numel() == 0:
                continue
            _, i, size = self.sid(t)
            item = t.element_size()
            span = (sum((s - 1) * st for s, st in zip(t.shape, t.stride()) if s > 0) + 1) * item
            off = t.storage_offset() * item
            if off == 0 and span >= size:
                out.append((i, 0, size))
            else:
                out.append((i, off, min(span, size - off)))
        return out

    def mark(self, kind, tensors):
        for t in tensors:
            if isinstance(t, torch.Tensor) and t.device == META and t.numel() > 0:
                self.kinds[self.sid(t, kind)[1]] = kind

    def iteration(self, n):
        self.events.append(("iter", n))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        schema = func._schema
        try:
            out = func(*args, **kwargs)
        except NotImplementedError:
            out = self.fallback(func, args, kwargs)
        name = func.overloadpacket.__name__
        returns_alias = [r.alias_info for r in schema.returns]
        is_view = bool(returns_alias) and all(a is not None and not a.is_write for a in returns_alias)
        if is_view or name in ("empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "lift_fresh",
                               "detach", "alias", "_local_scalar_dense", "set_", "_unsafe_view",
                               "_reshape_alias"):
            return out
        flat_args, _ = tree_flatten((args, kwargs))
        flat_out, _ = tree_flatten(out)
        written = []
        for i, a in enumerate(schema.arguments):
            if a.alias_info is not None and a.alias_info.is_write:
                v = args[i] if i < len(args) else kwargs.get(a.name)
                written += [x for x in tree_flatten(v)[0] if isinstance(x, torch.Tensor)]
        written_ids = {id(x) for x in written}
        reads = [t for t in flat_args if isinstance(t, torch.Tensor) and id(t) not in written_ids]
        writes = written + [t for t in flat_out if isinstance(t, torch.Tensor) and id(t) not in written_ids]
        metas = [t for t in reads + writes if isinstance(t, torch.Tensor) and t.device == META]
        if not metas:
            return out
        flops = matmul_flops(func, args, out)
        if name == "convolution":
            flops = conv_flops(out.shape, args[1], args[8])
        elif name == "convolution_backward":
            fwd = conv_flops(args[0].shape, args[2], args[9])
            mask = args[10]
            flops = fwd * ((1 if mask[0] else 0) + (1 if mask[1] else 0))
        moved = sum(nbytes_of(t) for t in metas)
        dur = self.roofline.ns(flops, moved, metas[0].dtype)
        self.events.append(("kernel", str(func), int(round(dur)), self.ranges(reads), self.ranges(writes)))
        return out

    @staticmethod
    def fallback(func, args, kwargs):
        name = func.overloadpacket.__name__
        if name == "convolution_backward":
            grad_out, inp, weight, bias_sizes = args[0], args[1], args[2], args[3]
            mask = args[10]
            mk = lambda shape: torch.empty(shape, dtype=grad_out.dtype, device=META)
            return (mk(inp.shape) if mask[0] else None, mk(weight.shape) if mask[1] else None,
                    mk(bias_sizes) if mask[2] and bias_sizes is not None else None)
        raise NotImplementedError(f"trace_torch.py: no meta kernel and no fallback for {func}")

    def write(self, path, header):
        last = {}
        for n, ev in enumerate(self.events):
            if ev[0] == "kernel":
                for i, _, _ in ev[3] + ev[4]:
                    last[i] = n
        alive = {i for ref, i, _ in self.refs.values() if not ref.expired()}
        sizes = {i: size for _, i, size in self.refs.values()}
        seen = set()
        kernels = 0
        with gzip.open(path, "wt", compresslevel=9) as f:
            f.write(json.dumps(header, separators=(",", ":")) + "\n")
            for n, ev in enumerate(self.events):
                if ev[0] == "iter":
                    f.write(json.dumps({"ev": "iter", "n": ev[1]}) + "\n")
                    continue
                _, name, dur, reads, writes = ev
                for i, _, _ in reads + writes:
                    if i not in seen:
                        seen.add(i)
                        f.write(json.dumps({"ev": "alloc", "id": i, "bytes": sizes[i], "kind": self.kinds.get(i, "activation")},
                                           separators=(",", ":")) + "\n")
                enc = lambda rs: [i if (o == 0 and b == sizes[i]) else [i, o, b] for i, o, b in rs]
                f.write(json.dumps({"ev": "kernel", "name": name, "dur_ns": dur, "reads": enc(reads), "writes": enc(writes)},
                                   separators=(",", ":")) + "\n")
                kernels += 1
                done = {i for i, _, _ in reads + writes if last.get(i) == n and i not in alive}
                for i in sorted(done):
                    f.write(json.dumps({"ev": "free", "id": i}) + "\n")
        return kernels


# ---- models ----

class Block(nn.Module):
    """A GPT-2 decoder block (pre-LayerNorm, fused QKV, GELU MLP), as in GPT-2 / nanoGPT."""

    def __init__(self, d, heads, device, dtype):
        super().__init__()
        kw = dict(device=device, dtype=dtype)
        self.heads = heads
        self.ln_1 = nn.LayerNorm(d, **kw)
        self.c_attn = nn.Linear(d, 3 * d, **kw)
        self.attn_proj = nn.Linear(d, d, **kw)
        self.ln_2 = nn.LayerNorm(d, **kw)
        self.c_fc = nn.Linear(d, 4 * d, **kw)
        self.mlp_proj = nn.Linear(4 * d, d, **kw)

    def forward(self, x, mask, cache=None):
        b, t, c = x.shape
        h = self.heads
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        q = q.view(b, t, h, c // h).transpose(1, 2)
        k = k.view(b, t, h, c // h).transpose(1, 2)
        v = v.view(b, t, h, c // h).transpose(1, 2)
        if cache is not None:
            if cache[0] is not None:  # a growing KV cache: the new keys/values are appended
                k = torch.cat([cache[0], k], dim=2)
                v = torch.cat([cache[1], v], dim=2)
            cache[0], cache[1] = k, v
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        if t > 1:
            att = att.masked_fill(mask[:, :, :t, :t] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        x = x + self.attn_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class GPT(nn.Module):
    """GPT-2 XL shape: 48 layers, 25 heads, width 1600, vocabulary 50257, context 1024."""

    def __init__(self, layers=48, heads=25, d=1600, vocab=50257, ctx=1024, device=META, dtype=torch.float32):
        super().__init__()
        kw = dict(device=device, dtype=dtype)
        self.wte = nn.Embedding(vocab, d, **kw)
        self.wpe = nn.Embedding(ctx, d, **kw)
        self.blocks = nn.ModuleList(Block(d, heads, device, dtype) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d, **kw)
        self.register_buffer("mask", torch.ones(1, 1, ctx, ctx, dtype=torch.bool, device=device), persistent=False)

    def forward(self, idx, pos, caches=None):
        x = self.wte(idx) + self.wpe(pos)
        for i, blk in enumerate(self.blocks):
            x = blk(x, self.mask, None if caches is None else caches[i])
        return F.linear(self.ln_f(x), self.wte.weight)  # tied LM head


def gpt_train(rec, args):
    model = GPT()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
    idx = torch.empty(args.batch, args.seq, dtype=torch.long, device=META)
    pos = torch.empty(args.seq, dtype=torch.long, device=META)
    targets = torch.empty(args.batch * args.seq, dtype=torch.long, device=META)
    with rec:
        rec.mark("weight", model.parameters())
        for it in range(args.iters):
            rec.iteration(it)
            logits = model(idx, pos)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            del logits, loss
        for st in opt.state.values():
            rec.mark("optimizer", [v for v in st.values() if isinstance(v, torch.Tensor)])
    return model, opt, idx, pos, targets  # keep persistent storages alive while writing


def gpt_infer(rec, args):
    model = GPT()
    idx = torch.empty(args.batch, args.seq, dtype=torch.long, device=META)
    pos = torch.empty(args.seq, dtype=torch.long, device=META)
    with torch.no_grad(), rec:
        rec.mark("weight", model.parameters())
        caches = [[None, None] for _ in model.blocks]
        rec.iteration(0)  # prefill
        logits = model(idx, pos, caches)
        nxt = torch.argmax(logits[:, -1, :], dim=-1, keepdim=True)
        del logits
        for step in range(args.decode):
            rec.iteration(step + 1)  # one decode step per "iteration"
            p = torch.empty(1, dtype=torch.long, device=META)
            logits = model(nxt, p, caches)
            nxt = torch.argmax(logits[:, -1, :], dim=-1, keepdim=True)
            del logits
        del caches, nxt
    return model, idx, pos


def resnet_train(rec, args):
    import torchvision
    model = torchvision.models.resnet50().to(META)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, foreach=False)
    x = torch.empty(args.batch, 3, 224, 224, device=META)
    y = torch.empty(args.batch, dtype=torch.long, device=META)
    with rec:
        rec.mark("weight", model.parameters())
        for it in range(args.iters):
            rec.iteration(it)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            del loss
    return model, opt, x, y


class RMSNorm(nn.Module):
    """RMSNorm (Zhang & Sennrich 2019), as in Llama: x / rms(x) * weight, in fp32."""

    def __init__(self, d, device, dtype, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d, device=device, dtype=dtype))

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


def rope(x, cos, sin):
    """Rotary position embedding (Su et al. 2021) in the rotate-half form Llama's code uses."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class LlamaBlock(nn.Module):
    """A Llama-style decoder block: pre-RMSNorm, rotary embeddings, grouped-query attention
    (`kv_heads` key/value heads shared by `heads` query heads), SwiGLU MLP, no biases."""

    def __init__(self, d, heads, kv_heads, ffn, device, dtype):
        super().__init__()
        kw = dict(device=device, dtype=dtype, bias=False)
        self.heads, self.kv_heads, self.hd = heads, kv_heads, d // heads
        self.attn_norm = RMSNorm(d, device, dtype)
        self.wq = nn.Linear(d, d, **kw)
        self.wk = nn.Linear(d, kv_heads * self.hd, **kw)
        self.wv = nn.Linear(d, kv_heads * self.hd, **kw)
        self.wo = nn.Linear(d, d, **kw)
        self.mlp_norm = RMSNorm(d, device, dtype)
        self.w_gate = nn.Linear(d, ffn, **kw)
        self.w_up = nn.Linear(d, ffn, **kw)
        self.w_down = nn.Linear(ffn, d, **kw)

    def forward(self, x, cos, sin, mask):
        b, t, _ = x.shape
        h = self.attn_norm(x)
        q = self.wq(h).view(b, t, self.heads, self.hd).transpose(1, 2)
        k = self.wk(h).view(b, t, self.kv_heads, self.hd).transpose(1, 2)
        v = self.wv(h).view(b, t, self.kv_heads, self.hd).transpose(1, 2)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        # Each key/value head serves `rep` query heads: expanded and copied, as Hugging Face's
        # Llama does (repeat_kv in transformers/models/llama/modeling_llama.py).
        rep = self.heads // self.kv_heads
        k = k[:, :, None].expand(b, self.kv_heads, rep, t, self.hd).reshape(b, self.heads, t, self.hd)
        v = v[:, :, None].expand(b, self.kv_heads, rep, t, self.hd).reshape(b, self.heads, t, self.hd)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.hd))
        att = F.softmax(att.masked_fill(mask[:, :, :t, :t] == 0, float("-inf")).float(), dim=-1).to(q.dtype)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, -1)
        x = x + self.wo(y)
        h = self.mlp_norm(x)
        return x + self.w_down(F.silu(self.w_gate(h)) * self.w_up(h))


class Llama(nn.Module):
    """A Llama-style decoder LM: token embedding, `layers` LlamaBlocks, RMSNorm, untied head."""

    def __init__(self, layers, d, heads, kv_heads, ffn, vocab, ctx, device=META, dtype=torch.bfloat16):
        super().__init__()
        self.embed = nn.Embedding(vocab, d, device=device, dtype=dtype)
        self.blocks = nn.ModuleList(LlamaBlock(d, heads, kv_heads, ffn, device, dtype) for _ in range(layers))
        self.norm = RMSNorm(d, device, dtype)
        self.head = nn.Linear(d, vocab, bias=False, device=device, dtype=dtype)
        hd = d // heads
        self.register_buffer("cos", torch.ones(ctx, hd, device=device, dtype=dtype), persistent=False)
        self.register_buffer("sin", torch.zeros(ctx, hd, device=device, dtype=dtype), persistent=False)
        self.register_buffer("mask", torch.ones(1, 1, ctx, ctx, dtype=torch.bool, device=device), persistent=False)

    def forward(self, idx):
        t = idx.size(1)
        x = self.embed(idx)
        cos, sin = self.cos[:t], self.sin[:t]
        for blk in self.blocks:
            x = blk(x, cos, sin, self.mask)
        return self.head(self.norm(x))


# Llama-style shapes (layers, width, heads, key/value heads, MLP width, vocabulary): a 1B and
# a 3B model in the proportions of Llama 3.2's published configurations.
LLAMA_SIZES = {"1b": (16, 2048, 32, 8, 8192, 128256), "3b": (28, 3072, 24, 8, 8192, 128256)}


def llama_train(rec, args):
    """Mixed precision as people train: bf16 weights for forward and backward, fp32 master
    weights and AdamW state; each step casts the bf16 gradients to fp32, steps the master
    weights and copies them back to bf16."""
    layers, d, heads, kv, ffn, vocab = LLAMA_SIZES[args.size]
    model = Llama(layers, d, heads, kv, ffn, vocab, args.seq)
    params = list(model.parameters())
    master = [p.detach().float().requires_grad_(False) for p in params]
    opt = torch.optim.AdamW(master, lr=1e-4, foreach=False)
    idx = torch.empty(args.batch, args.seq, dtype=torch.long, device=META)
    targets = torch.empty(args.batch * args.seq, dtype=torch.long, device=META)
    with rec:
        rec.mark("weight", params + master)
        for it in range(args.iters):
            rec.iteration(it)
            logits = model(idx)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets)
            loss.backward()
            for p, m in zip(params, master):
                m.grad = p.grad.float()
                p.grad = None
            opt.step()
            with torch.no_grad():
                for p, m in zip(params, master):
                    p.copy_(m)
                    m.grad = None
            del logits, loss
        for st in opt.state.values():
            rec.mark("optimizer", [v for v in st.values() if isinstance(v, torch.Tensor)])
    return model, params, master, opt, idx, targets


# name -> (function, what it records, sizes {size: shape tuple} or None, default size, default batch).
# A model with sizes reads its shape from its sizes table by args.size (`--size`, checked in main).
MODELS = {
    "gpt2-xl-train": (gpt_train, "GPT-2 XL-shaped decoder LM (48x1600, 25 heads, vocab 50257), fp32 training with AdamW",
                      None, None, 16),
    "gpt2-xl-infer": (gpt_infer, "GPT-2 XL-shaped decoder LM, fp32 inference: prefill, then decode steps with a growing KV cache",
                      None, None, 48),
    "resnet50-train": (resnet_train, "torchvision ResNet-50, fp32 training with SGD+momentum, 224x224 images", None, None, 512),
    "llama-train": (llama_train, "Llama-style decoder LM (RMSNorm, RoPE, SwiGLU, grouped-query attention), "
                                 "bf16 training with fp32 master weights and AdamW", LLAMA_SIZES, "1b", 8),
}


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", choices=sorted(MODELS))
    p.add_argument("out")
    p.add_argument("--batch", type=int)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--decode", type=int, default=32)
    p.add_argument("--size", help="the model's size, for models that have sizes: " +
                   "; ".join(f"{m}: {', '.join(v[2])} [{v[3]}]" for m, v in sorted(MODELS.items()) if v[2]))
    p.add_argument("--tflops-fp32", type=float, default=494.7, help="dense TF32 tensor-core TFLOP/s [H200: 494.7]")
    p.add_argument("--tflops-half", type=float, default=989.0, help="dense BF16/FP16 TFLOP/s [H200: 989]")
    p.add_argument("--bandwidth-tbs", type=float, default=4.8, help="memory bandwidth, TB/s [H200: 4.8]")
    p.add_argument("--floor-us", type=float, default=4.0, help="minimum kernel time, us [4]")
    a = p.parse_args(argv[1:])
    fn, what, sizes, default_size, default_batch = MODELS[a.model]
    if sizes is None and a.size is not None:
        p.error(f"--size: {a.model} has one size")
    if sizes is not None:
        a.size = a.size or default_size
        if a.size not in sizes:
            p.error(f"--size: invalid value '{a.size}' for {a.model} (accepted: {', '.join(sizes)})")
    if a.batch is None:
        a.batch = default_batch
    roof = Roofline(a.tflops_fp32 * 1e12, a.tflops_half * 1e12, a.bandwidth_tbs * 1e12, a.floor_us * 1e3)
    rec = Recorder(roof)
    keep = fn(rec, a)
    header = {
        "format": "spillway-trace", "version": 1,
        "source": f"scripts/trace_torch.py {a.model}: {what}; torch {torch.__version__} on the meta device",
        "model": a.model if sizes is None else f"{a.model}-{a.size}", "batch": a.batch, "seq": a.seq, "iterations": a.iters if "train" in a.model else None,
        "decode_steps": a.decode if "infer" in a.model else None,
        "roofline": {"tflops_fp32": a.tflops_fp32, "tflops_half": a.tflops_half, "bandwidth_tb_s": a.bandwidth_tbs,
                     "floor_us": a.floor_us, "figures": "NVIDIA H200 SXM datasheet (dense)"},
    }
    kernels = rec.write(a.out, header)
    del keep
    print(f"{a.out}: {kernels} kernels, {rec.next_id} storages", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
