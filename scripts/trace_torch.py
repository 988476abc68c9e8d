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
    scripts/trace_torch.py vit-train      OUT.jsonl.gz [--size b16|l16 --batch 128 --iters 3]
    scripts/trace_torch.py unet-train     OUT.jsonl.gz [--size small|sd --batch 32 --iters 3]
    scripts/trace_torch.py bert-finetune  OUT.jsonl.gz [--size base|large --batch 32 --seq 128 --iters 3]
    scripts/trace_torch.py moe-train      OUT.jsonl.gz [--size 8e|16e --batch 8 --seq 1024 --iters 3]
    scripts/trace_torch.py llm-serve-paged OUT.jsonl.gz [--size 1b|3b --batch 64 --steps 46|26]
    scripts/trace_torch.py gnn-train      OUT.jsonl.gz [--size products|papers100m --batch 1024 --steps 60|12]
    scripts/trace_torch.py dlrm-train     OUT.jsonl.gz [--size kaggle|terabyte --batch 2048 --steps 32|16]

Your own model: MODULE:FACTORY names a function (imported from MODULE, found on sys.path and
in the current folder) that returns a torch.nn.Module; each --input-shape is one positional
input of its forward() (comma-separated dimensions, --input-dtype for all of them):

    scripts/trace_torch.py mymodels:make_net OUT.jsonl.gz --input-shape 64,3,224,224 [--iters 3]
        [--mode train|infer] [--optimizer adamw|sgd] [--input-dtype float32|bfloat16|float16|long]

Training takes the mean of the output as its loss (the backward pass and the optimizer step
are what matter for memory, not the loss). The factory runs under torch.device("meta")
where this torch has it (2.0 or later), so parameters take no memory; with an older torch it
runs on the CPU and the module is then moved to the meta device. `spillway trace torch ...`
runs this script.

Needs PyTorch: Debian's python3-torch and python3-torchvision (scripts/bootstrap-traces) for
/usr/bin/python3, or `pip install torch` (the CPU build is enough) for another interpreter.
"""
import argparse
import gzip
import bisect
import collections
import itertools
import json
import math
import importlib
import os
import random
import sys

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.multiprocessing.reductions import StorageWeakRef
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten
except ImportError as e:
    sys.stderr.write(f"{os.environ.get('SPILLWAY_TRACE_PROG') or 'trace_torch.py'}: PyTorch is not installed for "
                     f"{sys.executable} ({e}): pip install torch (the CPU "
                     "build is enough: models run on the meta device), or apt-get install python3-torch for "
                     "/usr/bin/python3 (scripts/bootstrap-traces); spillway trace runs $SPILLWAY_PYTHON if set, "
                     "else /usr/bin/python3\n")
    sys.exit(2)

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

    # Partial accesses given by hand: the rows a gather really reads, the KV blocks a paged
    # attention kernel reads. The aten ops above would record a whole table for index_select.
    PAGE = 4096        # rows are coalesced at 4 KiB pages ...
    MAX_RANGES = 4096  # ... into at most this many ranges of one storage in one access list

    def row_ranges(self, t, rows):
        """Rows `rows` (indices along dim 0, repeats allowed) of t, as ranges of t's storage
        [(id, offset, bytes), ...], and the bytes moving them takes: each row once, rounded up
        to the GPU's 32-byte memory sectors.

        Coalesced at PAGE (4 KiB) pages: every page a row touches is taken whole, and rows
        whose pages are the same or adjacent share one range, so a range also covers bytes
        between the rows it joins, within a page. Were that more than MAX_RANGES ranges, the
        granule doubles (8 KiB, 16 KiB, ...) until it is not: up to 2 MiB, the simulator's chunk
        (docs/simulator.md), the chunks touched stay exact and only the bytes grow."""
        _, i, size = self.sid(t)
        item = t.element_size()
        row = (sum((s - 1) * st for s, st in zip(t.shape[1:], t.stride()[1:]) if s > 0) + 1) * item
        base, step = t.storage_offset() * item, t.stride(0) * item
        uniq = sorted(set(rows))
        g, runs = self.PAGE, []
        for r in uniq:
            lo, hi = (base + r * step) // g, (base + r * step + row - 1) // g
            if runs and lo <= runs[-1][1] + 1:
                runs[-1][1] = max(runs[-1][1], hi)
            else:
                runs.append([lo, hi])
        while len(runs) > self.MAX_RANGES:
            g, merged = g * 2, []
            for lo, hi in runs:
                lo, hi = lo // 2, hi // 2
                if merged and lo <= merged[-1][1] + 1:
                    merged[-1][1] = max(merged[-1][1], hi)
                else:
                    merged.append([lo, hi])
            runs = merged
        return [(i, lo * g, min((hi + 1) * g, size) - lo * g) for lo, hi in runs], len(uniq) * -(-row // 32) * 32

    def partial_kernel(self, name, reads=(), writes=(), flops=0, dtype=torch.float32):
        """Records one kernel whose accesses are given: each entry of reads and writes is a
        tensor (its extent, whole or a view's range, as an aten op's argument is recorded) or
        a pair (tensor, rows): only those rows of it along dim 0 (row_ranges). dur_ns is the
        roofline on `flops` and the bytes really moved: the tensors' bytes and the rows' own
        bytes, not the pages around them; a row both read and written counts twice."""
        lists, moved = [], 0
        for side in (reads, writes):
            out = []
            for x in side:
                if isinstance(x, torch.Tensor):
                    out += self.ranges([x])
                    moved += nbytes_of(x)
                else:
                    rs, nb = self.row_ranges(*x)
                    out += rs
                    moved += nb
            lists.append(out)
        dur = self.roofline.ns(flops, moved, dtype)
        self.events.append(("kernel", name, int(round(dur)), lists[0], lists[1]))

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
        x = self.attend(x, cos, sin, mask)
        h = self.mlp_norm(x)
        return x + self.w_down(F.silu(self.w_gate(h)) * self.w_up(h))

    def attend(self, x, cos, sin, mask):
        """The attention half of the block, with its residual: x + wo(attention(norm(x)))."""
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
        return x + self.wo(y)


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


def master_step(params, master, opt):
    """One mixed-precision optimizer step, as llama_train does it: the bf16 gradients are cast to
    the fp32 master weights' .grad, AdamW steps the masters, the bf16 weights get the new values.
    A weight without a gradient (an MoE expert that got no tokens) is left alone: AdamW skips a
    parameter whose .grad is None, and its bf16 copy is not rewritten."""
    for p, m in zip(params, master):
        m.grad = None if p.grad is None else p.grad.float()
        p.grad = None
    opt.step()
    with torch.no_grad():
        for p, m in zip(params, master):
            if m.grad is not None:
                p.copy_(m)
                m.grad = None


def train_loop(rec, args, params, master, opt, step):
    """`args.iters` iterations of step() (forward and backward), each followed by the optimizer:
    master_step when there are master weights, else a plain step. Marks weights and optimizer state."""
    with rec:
        rec.mark("weight", params + (master or []))
        for it in range(args.iters):
            rec.iteration(it)
            step(it)
            if master is not None:
                master_step(params, master, opt)
            else:
                opt.step()
                opt.zero_grad(set_to_none=True)
        for st in opt.state.values():
            rec.mark("optimizer", [v for v in st.values() if isinstance(v, torch.Tensor)])


def mixed(model):
    """The (bf16) parameters of `model` and fp32 master copies of them, for master_step."""
    params = list(model.parameters())
    master = [p.detach().float().requires_grad_(False) for p in params]
    return params, master


class EncoderBlock(nn.Module):
    """A Transformer encoder block: bidirectional multi-head self-attention and a GELU MLP, with
    LayerNorm before each (pre-LN, as ViT) or after each residual sum (post-LN, as BERT).
    `mask`, when given, is added to the attention scores (BERT's padding mask); dropout as given."""

    def __init__(self, d, heads, mlp, pre_norm, dropout, device, dtype):
        super().__init__()
        kw = dict(device=device, dtype=dtype)
        self.heads, self.pre_norm, self.dropout = heads, pre_norm, dropout
        self.ln_1 = nn.LayerNorm(d, eps=1e-6 if pre_norm else 1e-12, **kw)
        self.qkv = nn.Linear(d, 3 * d, **kw)
        self.proj = nn.Linear(d, d, **kw)
        self.ln_2 = nn.LayerNorm(d, eps=1e-6 if pre_norm else 1e-12, **kw)
        self.fc1 = nn.Linear(d, mlp, **kw)
        self.fc2 = nn.Linear(mlp, d, **kw)

    def attention(self, x, mask):
        b, t, c = x.shape
        h = self.heads
        q, k, v = self.qkv(x).view(b, t, 3, h, c // h).permute(2, 0, 3, 1, 4).unbind(0)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // h))
        if mask is not None:
            att = att + mask
        att = F.softmax(att.float(), dim=-1).to(x.dtype)
        att = F.dropout(att, self.dropout, self.training)
        y = (att @ v).transpose(1, 2).reshape(b, t, c)
        return F.dropout(self.proj(y), self.dropout, self.training)

    def mlp(self, x):
        return F.dropout(self.fc2(F.gelu(self.fc1(x))), self.dropout, self.training)

    def forward(self, x, mask=None):
        if self.pre_norm:
            x = x + self.attention(self.ln_1(x), mask)
            return x + self.mlp(self.ln_2(x))
        x = self.ln_1(x + self.attention(x, mask))
        return self.ln_2(x + self.mlp(x))


class ViT(nn.Module):
    """Vision Transformer (Dosovitskiy et al. 2020, "An Image is Worth 16x16 Words"): a strided
    conv cuts the image into patches, a class token and learned position embeddings join them,
    pre-LN encoder blocks, a final LayerNorm and a linear head on the class token."""

    def __init__(self, layers, d, heads, mlp, patch, image, classes, device=META, dtype=torch.bfloat16):
        super().__init__()
        kw = dict(device=device, dtype=dtype)
        self.patch = nn.Conv2d(3, d, patch, stride=patch, **kw)
        self.cls = nn.Parameter(torch.zeros(1, 1, d, **kw))
        self.pos = nn.Parameter(torch.zeros(1, (image // patch) ** 2 + 1, d, **kw))
        self.blocks = nn.ModuleList(EncoderBlock(d, heads, mlp, True, 0.0, device, dtype) for _ in range(layers))
        self.norm = nn.LayerNorm(d, eps=1e-6, **kw)
        self.head = nn.Linear(d, classes, **kw)

    def forward(self, img):
        x = self.patch(img).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.size(0), -1, -1), x], dim=1) + self.pos
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x[:, 0]))


# ViT shapes (layers, width, heads, MLP width, patch): ViT-B/16 and ViT-L/16 (Dosovitskiy et al.
# 2020, Table 1); 224x224 images, 1000 classes (ImageNet-1k).
VIT_SIZES = {"b16": (12, 768, 12, 3072, 16), "l16": (24, 1024, 16, 4096, 16)}


def vit_train(rec, args):
    """bf16 forward and backward, fp32 master weights and AdamW state (master_step); the softmax
    and the loss in fp32. No dropout (DeiT's and timm's recipe for ImageNet-1k)."""
    layers, d, heads, mlp, patch = VIT_SIZES[args.size]
    model = ViT(layers, d, heads, mlp, patch, 224, 1000)
    params, master = mixed(model)
    opt = torch.optim.AdamW(master, lr=1e-3, weight_decay=0.05, foreach=False)
    img = torch.empty(args.batch, 3, 224, 224, dtype=torch.bfloat16, device=META)
    labels = torch.empty(args.batch, dtype=torch.long, device=META)

    def step(it):
        F.cross_entropy(model(img).float(), labels).backward()
    train_loop(rec, args, params, master, opt, step)
    args.header_extra = {"seq": (224 // patch) ** 2 + 1, "image": 224}
    return model, params, master, opt, img, labels


class ResBlock(nn.Module):
    """A diffusion UNet residual block (Ho et al. 2020; the Stable Diffusion UNet's ResnetBlock):
    GroupNorm(32), SiLU, 3x3 conv, plus a projection of the timestep embedding; GroupNorm, SiLU,
    3x3 conv; a 1x1 conv on the shortcut when the width changes."""

    def __init__(self, cin, cout, temb, device, dtype):
        super().__init__()
        kw = dict(device=device, dtype=dtype)
        self.norm1 = nn.GroupNorm(32, cin, **kw)
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1, **kw)
        self.temb = nn.Linear(temb, cout, **kw)
        self.norm2 = nn.GroupNorm(32, cout, **kw)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, **kw)
        self.skip = nn.Conv2d(cin, cout, 1, **kw) if cin != cout else None

    def forward(self, x, temb):
        h = self.conv1(F.silu(self.norm1(x)))
        h = h + self.temb(F.silu(temb))[:, :, None, None]
        h = self.conv2(F.silu(self.norm2(h)))
        return h + (x if self.skip is None else self.skip(x))


class AttnBlock(nn.Module):
    """Self-attention over the pixels of a feature map: GroupNorm, QKV projection, multi-head
    attention (head width 64), output projection, residual."""

    def __init__(self, c, device, dtype):
        super().__init__()
        kw = dict(device=device, dtype=dtype)
        self.heads = max(1, c // 64)
        self.norm = nn.GroupNorm(32, c, **kw)
        self.qkv = nn.Linear(c, 3 * c, **kw)
        self.proj = nn.Linear(c, c, **kw)

    def forward(self, x):
        b, c, hh, ww = x.shape
        t, h = hh * ww, self.heads
        y = self.norm(x).flatten(2).transpose(1, 2)
        q, k, v = self.qkv(y).view(b, t, 3, h, c // h).permute(2, 0, 3, 1, 4).unbind(0)
        att = F.softmax(((q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // h))).float(), dim=-1).to(x.dtype)
        y = self.proj((att @ v).transpose(1, 2).reshape(b, t, c))
        return x + y.transpose(1, 2).reshape(b, c, hh, ww)


class UNet(nn.Module):
    """A Stable-Diffusion-style noise-prediction UNet (Rombach et al. 2022; Ho et al. 2020): a
    sinusoidal timestep embedding through a 2-layer SiLU MLP; conv_in; per level `blocks`
    ResBlocks (self-attention after each at the levels in `attn`) and a strided-conv downsample;
    a middle ResBlock-attention-ResBlock; the up path mirrors it with `blocks`+1 ResBlocks per
    level, each taking a skip connection concatenated on the channels, and nearest-neighbour
    upsampling with a conv; GroupNorm, SiLU, conv_out. Self-attention only (no text
    cross-attention)."""

    def __init__(self, ch, mults, blocks, attn, cin=4, device=META, dtype=torch.bfloat16):
        super().__init__()
        kw = dict(device=device, dtype=dtype)
        self.ch, temb = ch, 4 * ch
        self.t1, self.t2 = nn.Linear(ch, temb, **kw), nn.Linear(temb, temb, **kw)
        self.conv_in = nn.Conv2d(cin, ch, 3, padding=1, **kw)
        self.down, skips, c = nn.ModuleList(), [ch], ch
        for lvl, m in enumerate(mults):
            for _ in range(blocks):
                self.down.append(nn.ModuleList([ResBlock(c, ch * m, temb, device, dtype)] +
                                                ([AttnBlock(ch * m, device, dtype)] if lvl in attn else [])))
                c = ch * m
                skips.append(c)
            if lvl != len(mults) - 1:
                self.down.append(nn.Conv2d(c, c, 3, stride=2, padding=1, **kw))
                skips.append(c)
        self.mid = nn.ModuleList([ResBlock(c, c, temb, device, dtype), AttnBlock(c, device, dtype),
                                  ResBlock(c, c, temb, device, dtype)])
        self.up = nn.ModuleList()
        for lvl, m in reversed(list(enumerate(mults))):
            for _ in range(blocks + 1):
                self.up.append(nn.ModuleList([ResBlock(c + skips.pop(), ch * m, temb, device, dtype)] +
                                              ([AttnBlock(ch * m, device, dtype)] if lvl in attn else [])))
                c = ch * m
            if lvl != 0:
                self.up.append(nn.Conv2d(c, c, 3, padding=1, **kw))
        self.norm_out = nn.GroupNorm(32, c, **kw)
        self.conv_out = nn.Conv2d(c, cin, 3, padding=1, **kw)

    def embed_time(self, t):
        half = self.ch // 2
        freqs = torch.exp(torch.arange(half, device=t.device, dtype=torch.float32) * (-math.log(10000.0) / half))
        a = t.float()[:, None] * freqs[None]
        e = torch.cat([a.cos(), a.sin()], dim=-1).to(self.t1.weight.dtype)
        return self.t2(F.silu(self.t1(e)))

    def forward(self, x, t):
        temb = self.embed_time(t)
        h = self.conv_in(x)
        hs = [h]
        for mod in self.down:
            if isinstance(mod, nn.Conv2d):
                h = mod(h)
            else:
                h = mod[0](h, temb)
                if len(mod) > 1:
                    h = mod[1](h)
            hs.append(h)
        h = self.mid[2](self.mid[1](self.mid[0](h, temb)), temb)
        for mod in self.up:
            if isinstance(mod, nn.Conv2d):
                h = mod(F.interpolate(h, scale_factor=2.0, mode="nearest"))
            else:
                h = mod[0](torch.cat([h, hs.pop()], dim=1), temb)
                if len(mod) > 1:
                    h = mod[1](h)
        return self.conv_out(F.silu(self.norm_out(h)))


# UNet shapes (base width, width multipliers per level, ResBlocks per level, levels with
# self-attention, latent side). Both take 64x64x4 latents (512x512 images, as Stable Diffusion 1.x)
# and have one ResBlock per level on the way down (two on the way up), where Stable Diffusion has
# two (three): fewer layers keep a trace short. "sd" has Stable Diffusion 1.x's widths (320, 640,
# 1280, 1280) with self-attention at the 32x32, 16x16 and 8x8 levels (SD also has it at 64x64);
# "small" is 128 wide, 3 levels (128, 256, 512), self-attention at 32x32 and 16x16.
UNET_SIZES = {"small": (128, (1, 2, 4), 1, (1, 2), 64), "sd": (320, (1, 2, 4, 4), 1, (1, 2, 3), 64)}


def unet_train(rec, args):
    """One denoising training step per iteration (Ho et al. 2020): a random timestep per sample
    and Gaussian noise drawn on the GPU, mixed into the latents by the schedule's sqrt(alpha_bar);
    the UNet predicts the noise, MSE loss in fp32. The latents are given (precomputed by the
    autoencoder, which is not traced). bf16 forward and backward, fp32 master weights and AdamW
    state (master_step)."""
    ch, mults, blocks, attn, side = UNET_SIZES[args.size]
    model = UNet(ch, mults, blocks, attn)
    params, master = mixed(model)
    opt = torch.optim.AdamW(master, lr=1e-4, weight_decay=0.01, foreach=False)
    alpha_bar = torch.empty(1000, device=META)  # the noise schedule's cumulative products
    latents = torch.empty(args.batch, 4, side, side, device=META)

    def step(it):
        t = torch.randint(0, 1000, (args.batch,), device=META)
        noise = torch.randn_like(latents)
        a = alpha_bar[t][:, None, None, None]
        noisy = (a.sqrt() * latents + (1 - a).sqrt() * noise).to(torch.bfloat16)
        F.mse_loss(model(noisy, t).float(), noise).backward()
    train_loop(rec, args, params, master, opt, step)
    args.header_extra = {"seq": None, "latent": [4, side, side]}
    return model, params, master, opt, alpha_bar, latents


class Bert(nn.Module):
    """BERT (Devlin et al. 2019) for sequence classification: word, position and token-type
    embeddings summed, LayerNorm, dropout; post-LN encoder blocks with a padding mask added to
    the attention scores; the pooler (dense + tanh on the [CLS] token) and a linear classifier,
    as Hugging Face's BertForSequenceClassification. Dropout 0.1 everywhere, as published."""

    def __init__(self, layers, d, heads, mlp, vocab, ctx=512, labels=2, device=META, dtype=torch.float32):
        super().__init__()
        kw = dict(device=device, dtype=dtype)
        self.word = nn.Embedding(vocab, d, **kw)
        self.position = nn.Embedding(ctx, d, **kw)
        self.token_type = nn.Embedding(2, d, **kw)
        self.ln = nn.LayerNorm(d, eps=1e-12, **kw)
        self.blocks = nn.ModuleList(EncoderBlock(d, heads, mlp, False, 0.1, device, dtype) for _ in range(layers))
        self.pooler = nn.Linear(d, d, **kw)
        self.classifier = nn.Linear(d, labels, **kw)
        self.register_buffer("position_ids", torch.empty(1, ctx, dtype=torch.long, device=device), persistent=False)

    def forward(self, ids, token_types, attention_mask):
        t = ids.size(1)
        x = self.word(ids) + self.token_type(token_types) + self.position(self.position_ids[:, :t])
        x = F.dropout(self.ln(x), 0.1, self.training)
        mask = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        for blk in self.blocks:
            x = blk(x, mask)
        pooled = torch.tanh(self.pooler(x[:, 0]))
        return self.classifier(F.dropout(pooled, 0.1, self.training))


# BERT shapes (layers, width, heads, MLP width, vocabulary): BERT-base and BERT-large
# (Devlin et al. 2019; the released uncased configs), 512 positions.
BERT_SIZES = {"base": (12, 768, 12, 3072, 30522), "large": (24, 1024, 16, 4096, 30522)}


def bert_finetune(rec, args):
    """Fine-tuning for a 2-way sentence(-pair) classification, GLUE-style: fp32 weights,
    gradients and AdamW state (lr 2e-5, weight decay 0.01), cross-entropy on the classifier's
    logits; `--seq` tokens a sequence (the paper's GLUE runs: 128; up to 512)."""
    layers, d, heads, mlp, vocab = BERT_SIZES[args.size]
    if args.seq > 512:
        die(f"--seq {args.seq}: BERT has 512 positions")
    model = Bert(layers, d, heads, mlp, vocab)
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=2e-5, weight_decay=0.01, foreach=False)
    ids = torch.empty(args.batch, args.seq, dtype=torch.long, device=META)
    token_types = torch.empty(args.batch, args.seq, dtype=torch.long, device=META)
    attention_mask = torch.empty(args.batch, args.seq, dtype=torch.long, device=META)
    labels = torch.empty(args.batch, dtype=torch.long, device=META)

    def step(it):
        F.cross_entropy(model(ids, token_types, attention_mask), labels).backward()
    train_loop(rec, args, params, None, opt, step)
    return model, params, opt, ids, token_types, attention_mask, labels


class Expert(nn.Module):
    """One SwiGLU expert: w_down(silu(w_gate(x)) * w_up(x)), no biases."""

    def __init__(self, d, ffn, device, dtype):
        super().__init__()
        kw = dict(device=device, dtype=dtype, bias=False)
        self.w_gate, self.w_up, self.w_down = nn.Linear(d, ffn, **kw), nn.Linear(d, ffn, **kw), nn.Linear(ffn, d, **kw)

    def forward(self, x):
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))


class MoEBlock(LlamaBlock):
    """A Mixtral-style decoder block (Jiang et al. 2024, "Mixtral of Experts"): a LlamaBlock's
    attention, and for the MLP `experts` SwiGLU experts and a linear router; each token goes to
    its top-2 experts, their outputs weighted by the router's softmax renormalized over the two.

    After routing, the block does what dropless MoE code does: sorts the (token, choice) pairs by
    expert, gathers each expert's token rows into a buffer (index_select), runs the expert on it,
    and adds the weighted outputs back (index_add_). How many tokens each expert gets cannot come
    from the data on the meta device: `counts` (one per expert, summing to 2 x tokens) says; an
    expert with none is not run, so it gets no gradient and the optimizer leaves it alone."""

    def __init__(self, d, heads, kv_heads, ffn, experts, device, dtype):
        super().__init__(d, heads, kv_heads, ffn, device, dtype)
        del self.w_gate, self.w_up, self.w_down  # the dense MLP: replaced by the experts
        self.router = nn.Linear(d, experts, bias=False, device=device, dtype=dtype)
        self.experts = nn.ModuleList(Expert(d, ffn, device, dtype) for _ in range(experts))

    def moe(self, h, counts):
        x = h.reshape(-1, h.size(-1))
        probs = F.softmax(self.router(x).float(), dim=-1)
        weights, chosen = torch.topk(probs, 2, dim=-1)
        weights = (weights / weights.sum(dim=-1, keepdim=True)).to(x.dtype).view(-1)
        order = torch.argsort(chosen.view(-1))  # the (token, choice) pairs, sorted by expert
        rows = order // 2                       # and their token rows
        y = torch.zeros_like(x)
        start = 0
        for expert, n in zip(self.experts, counts):
            if n == 0:
                continue
            sel = rows[start:start + n]
            out = expert(x.index_select(0, sel)) * weights.index_select(0, order[start:start + n]).unsqueeze(1)
            y.index_add_(0, sel, out)
            start += n
        return y.view_as(h)

    def forward(self, x, cos, sin, mask, counts):
        x = self.attend(x, cos, sin, mask)
        return x + self.moe(self.mlp_norm(x), counts)


class MoE(Llama):
    """A Mixtral-style MoE decoder LM: a Llama with MoEBlocks."""

    def __init__(self, layers, d, heads, kv_heads, ffn, experts, vocab, ctx, device=META, dtype=torch.bfloat16):
        super().__init__(0, d, heads, kv_heads, ffn, vocab, ctx, device, dtype)
        self.blocks = nn.ModuleList(MoEBlock(d, heads, kv_heads, ffn, experts, device, dtype) for _ in range(layers))

    def forward(self, idx, counts):
        t = idx.size(1)
        x = self.embed(idx)
        cos, sin = self.cos[:t], self.sin[:t]
        for blk, c in zip(self.blocks, counts):
            x = blk(x, cos, sin, self.mask, c)
        return self.head(self.norm(x))


def expert_loads(rng, experts, layers, steps, tokens):
    """Tokens per expert, per step and per layer, for top-2 routing with load imbalance.

    Routers in practice spread tokens unevenly, the more so without (or early under) a
    balancing loss: a few experts get most tokens, some get none (Shazeer et al. 2017, Fedus et
    al. 2021). Modeled as: each layer has a lasting popularity b ~ Dirichlet(1, ..., 1) over its
    experts; each step draws p ~ Dirichlet(E b) around it (the step-to-step drift is as wide as
    the spread between layers); each token then picks 2 different experts with probability p."""
    def dirichlet(alphas):
        g = [rng.gammavariate(a, 1.0) for a in alphas]
        return [x / sum(g) for x in g]
    popularity = [dirichlet([1.0] * experts) for _ in range(layers)]
    loads = []
    for _ in range(steps):
        step = []
        for b in popularity:
            cum = list(itertools.accumulate(dirichlet([experts * x for x in b])))
            pick = lambda: min(bisect.bisect_left(cum, rng.random() * cum[-1]), experts - 1)
            n = [0] * experts
            for _ in range(tokens):
                first, second = pick(), pick()
                while second == first:
                    second = pick()
                n[first] += 1
                n[second] += 1
            step.append(n)
        loads.append(step)
    return loads


# MoE shapes (layers, width, heads, key/value heads, expert MLP width, experts, vocabulary):
# Mixtral 8x7B's proportions (MLP 3.5 x width, 8 key/value heads, vocabulary 32000, top-2) at
# modest widths, with few layers to keep a trace short: 8 experts x 5 layers at width 1024,
# 16 experts x 3 layers at width 1536.
MOE_SIZES = {"8e": (5, 1024, 16, 8, 3584, 8, 32000), "16e": (3, 1536, 24, 8, 5376, 16, 32000)}
MOE_SEED = 20240108  # the expert loads' random.Random seed, fixed: the same trace every time


def moe_train(rec, args):
    """bf16 forward and backward, fp32 master weights and AdamW state (master_step); an expert
    that got no tokens in a step has no gradient that step and AdamW skips it (its weights and
    state are not touched). Expert loads from expert_loads(random.Random(MOE_SEED)), in the
    trace header as expert_tokens[step][layer][expert]. No router balancing loss."""
    layers, d, heads, kv, ffn, experts, vocab = MOE_SIZES[args.size]
    model = MoE(layers, d, heads, kv, ffn, experts, vocab, args.seq)
    with rec:  # recorded: making the masters reads every weight, so experts idle in every step are in the trace too
        params, master = mixed(model)
    opt = torch.optim.AdamW(master, lr=1e-4, foreach=False)
    loads = expert_loads(random.Random(MOE_SEED), experts, layers, args.iters, args.batch * args.seq)
    idx = torch.empty(args.batch, args.seq, dtype=torch.long, device=META)
    targets = torch.empty(args.batch * args.seq, dtype=torch.long, device=META)

    def step(it):
        logits = model(idx, loads[it])
        F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets).backward()
    train_loop(rec, args, params, master, opt, step)
    args.header_extra = {"seed": MOE_SEED, "experts": experts, "top_k": 2, "expert_tokens": loads}
    return model, params, master, opt, idx, targets


# ---- data-dependent partial accesses: a paged KV cache, GNN feature gathers, DLRM embeddings ----

def power_law_rows(rng, n, s, count, salt=0):
    """`count` ids out of range(n), with repeats: the id of rank r (1..n) comes with probability
    about r^-s / sum(k^-s) (a Zipf-like law, drawn by inverting the continuous power law's
    CDF), and ranks map to ids by the bijection r -> ((r - 1) * 2654435761 + salt) mod n (a
    prime above every n here), so the hot rows lie scattered over a table, as hashed ids do."""
    if s == 1.0:
        draw = lambda: n ** rng.random()
    else:
        e, top = 1.0 / (1.0 - s), n ** (1.0 - s) - 1.0
        draw = lambda: (top * rng.random() + 1.0) ** e
    return [((min(int(draw()), n) - 1) * 2654435761 + salt) % n for _ in range(count)]


def poisson(rng, mean):
    """A Poisson-distributed count (arrivals in one unit of time at rate `mean`)."""
    k, t = 0, rng.expovariate(mean)
    while t < 1.0:
        k, t = k + 1, t + rng.expovariate(mean)
    return k


KV_BLOCK = 16  # tokens a KV-cache block: vLLM's default block_size

# Paged-KV serving: (Llama shape in LLAMA_SIZES, KV pool blocks, most tokens a step (vLLM's
# max_num_batched_tokens), requests arriving a step (Poisson mean), prompt tokens and output
# tokens (uniform ranges), engine steps run before recording, engine steps recorded). The most
# sequences running at once (vLLM's max_num_seqs) is --batch. The pools hold 32Ki tokens
# (1 GiB for 1b, 3.5 GiB for 3b), fewer than 64 sequences of the mean length need, so the
# pool bounds admission. Outputs are short so that sequences finish within the trace.
SERVE_SIZES = {"1b": ("1b", 2048, 4096, 2.0, (16, 1024), (8, 64), 64, 46),
               "3b": ("3b", 2048, 4096, 2.0, (16, 1024), (8, 64), 64, 26)}
SERVE_SEED = 20240611  # the request stream's random.Random seed, fixed: the same trace every time


class Request:
    def __init__(self, rid, prompt, out):
        self.rid, self.prompt, self.out = rid, prompt, out
        self.table, self.ctx, self.gen = [], 0, 0   # KV blocks, tokens cached, tokens generated


def llm_serve_paged(rec, args):
    """LLM serving with continuous batching over a paged KV cache, as vLLM does it (Kwon et al.
    2023, "Efficient Memory Management for Large Language Model Serving with PagedAttention";
    vLLM's V1 engine). One pool tensor [layers, K/V, blocks, 16 tokens, kv heads, head width]
    (bf16) holds every KV block; each sequence has a block table. Requests arrive (Poisson,
    uniform prompt and output lengths, from random.Random(SERVE_SEED)) and wait; every engine
    step runs one decode token for each running sequence and admits waiting ones (first come
    first served) while there is room (max_num_seqs, the token budget, free blocks for the
    prompt, keeping vLLM's 1% of the blocks free), whose prompts are prefilled in the same
    step: one forward pass over all the step's tokens. Blocks come from a free list: taken
    from the front, and a finished sequence's blocks go back to the end (in reverse, as vLLM
    V1's free block queue does), so later sequences reuse them. A sequence whose next token
    starts a block takes one; with none free, the latest-admitted sequence is preempted
    (recompute: its blocks freed, it waits again).
    The first `warmup` steps run the scheduler only, unrecorded, so the trace starts at a busy
    server in its steady state; the blocks those steps filled are read in the trace (in the
    simulator, untouched until then, they are created on the GPU at their first touch).

    The forward pass is recorded kernel by kernel as vLLM's fused kernels run it (not as aten
    ops): embedding gather (the step's token rows of the table), per layer rms_norm /
    fused_add_rms_norm, qkv_proj, rotary_embedding (the positions' rows of cos/sin),
    reshape_and_cache (writes each new token's slot: [pool, offset, bytes] per K and V),
    paged_attention (reads exactly the blocks in the block tables of the step's sequences),
    o_proj, fused_add_rms_norm, gate_up_proj, silu_and_mul, down_proj; then the final norm,
    the last token's rows, lm_head (fp32 logits), sampling. Inputs (token ids, positions, slot
    mapping, block tables, lengths) are copied into persistent buffers each step, as vLLM V1's
    model runner does. Weights are a Llama (LLAMA_SIZES) in bf16; token ids are drawn
    Zipf-like over the vocabulary. Not modelled: chunked prefill (a prompt is admitted whole or
    waits), prefix caching, CUDA graphs, speculative decoding."""
    shape, pool_blocks, budget, rate, prompt_range, out_range, warmup, steps = SERVE_SIZES[args.size]
    layers, d, heads, kv, ffn, vocab = LLAMA_SIZES[shape]
    steps, max_seqs, hd = args.steps or steps, args.batch, d // heads
    args.seq = None  # lengths vary: prompt_tokens and output_tokens in the header
    max_ctx = prompt_range[1] + out_range[1]
    model = Llama(layers, d, heads, kv, ffn, vocab, max_ctx)  # its weights; its forward is not used
    E = lambda *s, dtype=torch.bfloat16: torch.empty(*s, device=META, dtype=dtype)
    bf = torch.bfloat16
    pool = E(layers, 2, pool_blocks, KV_BLOCK, kv, hd)
    # vLLM V1's persistent input buffers (GPUModelRunner): filled each step from the host
    ids_buf, pos_buf, slot_buf = (E(budget, dtype=torch.long) for _ in range(3))
    table_buf = E(max_seqs, -(-max_ctx // KV_BLOCK), dtype=torch.int32)
    lens_buf, qstart_buf = E(max_seqs, dtype=torch.int32), E(max_seqs + 1, dtype=torch.int32)
    rng = random.Random(SERVE_SEED)
    free = collections.deque(range(pool_blocks))
    waiting, running = collections.deque(), []
    stats = {"arrived": 0, "admitted": 0, "finished": 0, "preempted": 0}
    per_step = []  # (running sequences, prefills, tokens, blocks read) each step

    def release(seq):
        free.extend(reversed(seq.table))
        seq.table = []

    def preempt(seq):  # recompute: it waits again, its tokens so far now its prompt
        running.remove(seq)
        release(seq)
        seq.prompt, seq.out, seq.gen, seq.ctx = seq.prompt + seq.gen, seq.out - seq.gen, 0, 0
        waiting.appendleft(seq)
        stats["preempted"] += 1

    with torch.no_grad(), rec:
        rec.mark("weight", list(model.parameters()) + [model.cos, model.sin])
        rec.mark("kv-cache", [pool])
        for step in range(warmup + steps):
            if step == warmup:
                before = dict(stats)
            if step >= warmup:
                rec.iteration(step - warmup)
            for _ in range(poisson(rng, rate)):
                waiting.append(Request(stats["arrived"], rng.randint(*prompt_range), rng.randint(*out_range)))
                stats["arrived"] += 1
            sched, tokens = [], 0
            for seq in list(running):  # decode: one token each, oldest first
                if seq not in running:
                    continue
                if seq.ctx % KV_BLOCK == 0:  # the new token starts a block
                    while not free and seq in running:
                        preempt(running[-1])
                    if not free:
                        continue
                    seq.table.append(free.popleft())
                sched.append((seq, 1))
                tokens += 1
            prefills = 0
            while waiting and len(running) < max_seqs:  # admit: the whole prompt in this step
                seq = waiting[0]
                need = -(-seq.prompt // KV_BLOCK)
                if tokens + seq.prompt > budget or len(free) - need < pool_blocks // 100:  # vLLM's 1% watermark
                    break
                waiting.popleft()
                seq.table = [free.popleft() for _ in range(need)]
                running.append(seq)
                sched.append((seq, seq.prompt))
                tokens += seq.prompt
                prefills += 1
                stats["admitted"] += 1
            T, S = tokens, len(sched)
            slots, positions, blocks, last_rows, att_flops = [], [], [], [], 0
            for seq, q in sched:
                positions += range(seq.ctx, seq.ctx + q)
                slots += [seq.table[p // KV_BLOCK] * KV_BLOCK + p % KV_BLOCK for p in range(seq.ctx, seq.ctx + q)]
                seq.ctx += q
                blocks += seq.table
                last_rows.append(len(positions) - 1)
                att_flops += 4 * heads * hd * (q * (q + 1) // 2 if q > 1 else seq.ctx)
            if step < warmup:
                pass
            elif not sched:
                per_step.append((0, 0, 0, 0))
            else:
                per_step.append((len(running), prefills, T, len(blocks)))
                token_ids = power_law_rows(rng, vocab, 1.0, T, salt=1)
                ids, pos, slot = ids_buf[:T], pos_buf[:T], slot_buf[:T]
                table, lens, qstart = table_buf[:S], lens_buf[:S], qstart_buf[:S + 1]
                rec.partial_kernel("copy_inputs_h2d", writes=[ids, pos, slot, table, lens, qstart])
                x = E(T, d)
                rec.partial_kernel("embedding", [ids, (model.embed.weight, token_ids)], [x], dtype=bf)
                res = None
                for l, blk in enumerate(model.blocks):
                    kblocks, vblocks = pool[l, 0].view(pool_blocks, -1), pool[l, 1].view(pool_blocks, -1)
                    kslots, vslots = pool[l, 0].view(pool_blocks * KV_BLOCK, -1), pool[l, 1].view(pool_blocks * KV_BLOCK, -1)
                    if res is None:
                        res, x = x, E(T, d)
                        rec.partial_kernel("rms_norm", [res, blk.attn_norm.weight], [x], dtype=bf)
                    else:
                        rec.partial_kernel("fused_add_rms_norm", [x, res, blk.attn_norm.weight], [x, res], dtype=bf)
                    qkv = E(T, (heads + 2 * kv) * hd)
                    rec.partial_kernel("qkv_proj", [x, blk.wq.weight, blk.wk.weight, blk.wv.weight], [qkv],
                                       flops=2 * T * d * (heads + 2 * kv) * hd, dtype=bf)
                    rec.partial_kernel("rotary_embedding", [pos, (model.cos, positions), (model.sin, positions), qkv], [qkv],
                                       dtype=bf)
                    rec.partial_kernel("reshape_and_cache", [qkv, slot], [(kslots, slots), (vslots, slots)], dtype=bf)
                    att = E(T, heads * hd)
                    rec.partial_kernel("paged_attention", [qkv, table, lens, qstart, (kblocks, blocks), (vblocks, blocks)],
                                       [att], flops=att_flops, dtype=bf)
                    x = E(T, d)
                    rec.partial_kernel("o_proj", [att, blk.wo.weight], [x], flops=2 * T * heads * hd * d, dtype=bf)
                    rec.partial_kernel("fused_add_rms_norm", [x, res, blk.mlp_norm.weight], [x, res], dtype=bf)
                    gu = E(T, 2 * ffn)
                    rec.partial_kernel("gate_up_proj", [x, blk.w_gate.weight, blk.w_up.weight], [gu],
                                       flops=4 * T * d * ffn, dtype=bf)
                    act = E(T, ffn)
                    rec.partial_kernel("silu_and_mul", [gu], [act], dtype=bf)
                    x = E(T, d)
                    rec.partial_kernel("down_proj", [act, blk.w_down.weight], [x], flops=2 * T * ffn * d, dtype=bf)
                    del qkv, att, gu, act
                rec.partial_kernel("fused_add_rms_norm", [x, res, model.norm.weight], [x, res], dtype=bf)
                last = E(S, d)
                rec.partial_kernel("index_select", [(x, last_rows)], [last], dtype=bf)
                logits = E(S, vocab, dtype=torch.float32)
                rec.partial_kernel("lm_head", [last, model.head.weight], [logits], flops=2 * S * d * vocab, dtype=bf)
                rec.partial_kernel("sample", [logits], [E(S, dtype=torch.long)])
                del x, res, last, logits
            for seq, _ in sched:
                seq.gen += 1
            for seq in [s for s in running if s.gen >= s.out]:
                running.remove(seq)
                release(seq)
                stats["finished"] += 1
    args.header_extra = {
        "seed": SERVE_SEED, "kv_block_tokens": KV_BLOCK, "kv_pool_blocks": pool_blocks, "kv_pool_bytes": nbytes_of(pool),
        "max_num_seqs": max_seqs, "max_num_batched_tokens": budget, "arrivals_per_step": rate,
        "prompt_tokens": prompt_range, "output_tokens": out_range,
        "warmup_steps": warmup, "engine_steps": steps,
        "requests_in_trace": {k: v - before[k] for k, v in stats.items()}, "waiting_at_end": len(waiting),
        "per_step": {"running": [s[0] for s in per_step], "prefills": [s[1] for s in per_step],
                     "tokens": [s[2] for s in per_step], "kv_blocks_read": [s[3] for s in per_step]},
        "partial_access": {"page_bytes": rec.PAGE, "max_ranges": rec.MAX_RANGES},
    }
    return model, pool, ids_buf, pos_buf, slot_buf, table_buf, lens_buf, qstart_buf


# GraphSAGE on Open Graph Benchmark graphs (Hu et al. 2020), their published sizes: (nodes,
# feature width, classes, CSR entries = each undirected edge both ways, hidden width, fanouts
# from the seeds outward, minibatches). ogbn-products: 2,449,029 nodes, 61,859,140 edges, 100
# features, 47 classes; ogbn-papers100M: 111,059,956 nodes, 1,615,685,872 edges, 128 features,
# 172 classes. Feature tables 0.98 GB and 56.9 GB (fp32), CSR indices 0.99 GB and 25.9 GB (int64).
# papers100M: 12 minibatches, as each touches nearly every 2 MiB chunk of 83 GB (a sweep of 50
# took 19 minutes on 2 cores).
GNN_SIZES = {"products": (2449029, 100, 47, 2 * 61859140, 256, (15, 10), 60),
             "papers100m": (111059956, 128, 172, 2 * 1615685872, 256, (15, 10), 12)}
GNN_SEED = 20240612       # the sampler's random.Random seed, fixed
GNN_DEGREE_EXPONENT = 0.8  # a sampled neighbour's id: rank^-0.8, a power-law degree distribution (our choice)


def gnn_train(rec, args):
    """GraphSAGE (Hamilton et al. 2017; mean aggregation, 2 layers, hidden 256, ReLU, dropout
    0.5, Adam) minibatch training with neighbour sampling, as DGL (sampling with use_uva) and
    PyG do it with the graph and the node features in GPU-addressable memory: each minibatch
    takes --batch random seed nodes, samples 15 neighbours of each seed (hop 1), then 10
    neighbours of every node of hops 0-1 (hop 2, DGL's message-flow graphs), gathers the
    features of all the nodes sampled and the seeds' labels, runs the two layers on the
    sampled graph (dense: a fixed fanout makes the mean a reshape), backward, Adam.

    The CSR (indptr and indices, int64), the feature table (nodes x features, fp32) and the
    labels are recorded as partial accesses: each sampling kernel reads indptr[v], indptr[v+1]
    and v's neighbour list for its frontier nodes, the gather reads exactly the feature rows
    of the sampled nodes, the label gather the seeds' labels. The graph is synthetic: a
    neighbour's id is drawn from a power law over nodes (GNN_DEGREE_EXPONENT: hubs are sampled
    most, as with a power-law degree distribution), scattered over the ids (power_law_rows),
    independent of the node sampled from; every node has E/N neighbours, its list taken to
    start at entry v*E/N; seeds are uniform over all nodes (the training split is not
    modelled). Everything after the gathers is recorded as aten ops."""
    n, f, classes, edges, hidden, fanouts, steps = GNN_SIZES[args.size]
    steps, batch = args.steps or steps, args.batch
    args.seq = None  # not a sequence model's length: dropped from the header
    rng = random.Random(GNN_SEED)
    feat = torch.empty(n, f, device=META)
    labels = torch.empty(n, dtype=torch.long, device=META)
    indptr = torch.empty(n + 1, dtype=torch.long, device=META)
    indices = torch.empty(edges, dtype=torch.long, device=META)
    per_node = edges / n
    convs = [(nn.Linear(f, hidden, device=META), nn.Linear(f, hidden, bias=False, device=META)),
             (nn.Linear(hidden, classes, device=META), nn.Linear(hidden, classes, bias=False, device=META))]
    params = [p for pair in convs for lin in pair for p in lin.parameters()]
    opt = torch.optim.Adam(params, lr=3e-3, foreach=False)
    L = lambda k: torch.empty(k, dtype=torch.long, device=META)
    sizes = []  # (nodes of hops 0-1, all nodes) a minibatch

    def sage(pair, x, dst, k, nbr):
        agg = x.index_select(0, nbr).view(dst, k, -1).mean(1)
        return pair[0](agg) + pair[1](x[:dst])

    with rec:
        rec.mark("feature-table", [feat])
        rec.mark("graph", [labels, indptr, indices])
        rec.mark("weight", params)
        for it in range(steps):
            rec.iteration(it)
            seeds = rng.sample(range(n), batch)
            order, where = list(seeds), {v: i for i, v in enumerate(seeds)}
            n_id = L(batch)
            rec.partial_kernel("randperm_seeds", writes=[n_id])
            blocks = []  # (targets, fanout, local neighbour indices)
            for hop, k in enumerate(fanouts):
                frontier = order[:]  # every node so far: the next layer's targets
                lists = []
                for v in frontier:
                    a = int(v * per_node)
                    lists += (a, max(a, min(int((v + 1) * per_node), edges) - 1))
                nbrs = power_law_rows(rng, n, GNN_DEGREE_EXPONENT, len(frontier) * k)
                out = L(len(nbrs))
                rec.partial_kernel(f"sample_neighbors_hop{hop + 1}",
                                   [n_id, (indptr, frontier + [v + 1 for v in frontier]), (indices, lists)], [out])
                local = []
                for v in nbrs:
                    if v not in where:
                        where[v] = len(order)
                        order.append(v)
                    local.append(where[v])
                prev, n_id, nbr = n_id, L(len(order)), L(len(nbrs))
                rec.partial_kernel("unique_relabel", [prev, out], [n_id, nbr])
                blocks.append((len(frontier), k, nbr))
                del prev, out
            sizes.append((blocks[1][0], len(order)))
            x = torch.empty(len(order), f, device=META)
            rec.partial_kernel("gather_features", [n_id, (feat, order)], [x])
            y = L(batch)
            rec.partial_kernel("gather_labels", [n_id[:batch], (labels, seeds)], [y])
            (dst1, k1, nbr1), (dst2, k2, nbr2) = blocks
            h = F.dropout(F.relu(sage(convs[0], x, dst2, k2, nbr2)), 0.5, training=True)
            loss = F.cross_entropy(sage(convs[1], h, dst1, k1, nbr1), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            del x, y, h, loss, blocks, nbr1, nbr2, n_id
        for st in opt.state.values():
            rec.mark("optimizer", [v for v in st.values() if isinstance(v, torch.Tensor)])
    args.iters = steps
    args.header_extra = {
        "seed": GNN_SEED, "nodes": n, "features": f, "classes": classes, "csr_entries": edges, "fanouts": fanouts,
        "degree_exponent": GNN_DEGREE_EXPONENT,
        "sampled_nodes": {"hops_0_1": [s[0] for s in sizes], "all": [s[1] for s in sizes]},
        "partial_access": {"page_bytes": rec.PAGE, "max_ranges": rec.MAX_RANGES},
    }
    return feat, labels, indptr, indices, convs, opt


# DLRM (Naumov et al. 2019) on Criteo: rows of the 26 embedding tables. Kaggle (Display
# Advertising Challenge): the counts the DLRM reference prints for the Kaggle data set
# (33,762,577 rows). Terabyte: Criteo 1TB with ids capped at 40M, the table sizes of the MLPerf
# DLRM configuration in TorchRec's examples (204,184,588 rows).
DLRM_KAGGLE_ROWS = [1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194, 27, 14992,
                    5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572]
DLRM_TERABYTE_ROWS = [40000000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 40000000, 3067956, 405282, 10, 2209,
                      11938, 155, 4, 976, 14, 40000000, 40000000, 40000000, 590152, 12973, 108, 36]
# (table rows, embedding width, bottom MLP widths after the 13 dense features, top MLP widths,
# minibatches): the DLRM reference's Kaggle configuration (--arch-sparse-feature-size=16,
# --arch-mlp-bot=13-512-256-64-16, --arch-mlp-top=512-256-1) and the MLPerf one (128,
# 13-512-256-128, 1024-1024-512-256-1). Tables 2.2 GB and 104.5 GB (fp32).
DLRM_SIZES = {"kaggle": (DLRM_KAGGLE_ROWS, 16, (512, 256, 64, 16), (512, 256, 1), 32),
              "terabyte": (DLRM_TERABYTE_ROWS, 128, (512, 256, 128), (1024, 1024, 512, 256, 1), 16)}
DLRM_SEED = 20240613  # the lookups' random.Random seed, fixed
DLRM_ZIPF = 1.05       # row popularity rank^-1.05 in every table (our choice: Criteo's ids are heavy-tailed)


def dlrm_train(rec, args):
    """DLRM training (Naumov et al. 2019, "Deep Learning Recommendation Model for Personalization
    and Recommendation Systems"): a bottom MLP over the 13 dense features, one lookup in each of
    26 embedding tables (one-hot, as in Criteo), the pairwise dot products of the 27 vectors
    (interaction "dot"), their concatenation with the bottom MLP's output, a top MLP, binary
    cross-entropy. Dense layers: fp32, SGD. Embeddings: fp32 tables with row-wise Adagrad
    (one fp32 accumulator a row), the update fused into the backward as FBGEMM's table-batched
    embedding kernels do it: only the rows looked up are read and written.

    Each minibatch draws --batch ids per table, Zipf-like (DLRM_ZIPF; Criteo's categorical
    values are heavy-tailed: a few ids are most lookups), hot ids scattered over the table as
    hashing does (power_law_rows). Recorded by hand, as partial accesses: each table's forward
    gather (reads the rows looked up, writes the pooled [batch, width] output) and its backward
    (reads the output's gradient, reads and writes the rows and their Adagrad accumulators).
    The batch is copied in each step (dense features, ids, labels). The rest (MLPs,
    interaction, loss, backward, SGD) is recorded as aten ops."""
    rows, dim, bottom_w, top_w, steps = DLRM_SIZES[args.size]
    steps, batch = args.steps or steps, args.batch
    args.seq = None  # not a sequence model's length: dropped from the header
    rng = random.Random(DLRM_SEED)
    tables = [torch.empty(r, dim, device=META) for r in rows]
    accum = [torch.empty(r, device=META) for r in rows]

    def mlp(widths, relu_last):
        layers = []
        for i, (a, b) in enumerate(zip(widths, widths[1:])):
            layers.append(nn.Linear(a, b, device=META))
            if relu_last or i < len(widths) - 2:
                layers.append(nn.ReLU())
        return nn.Sequential(*layers)
    nf = len(tables) + 1
    bottom = mlp((13,) + bottom_w, True)
    top = mlp((dim + nf * (nf - 1) // 2,) + top_w, False)
    dense_params = list(bottom.parameters()) + list(top.parameters())
    opt = torch.optim.SGD(dense_params, lr=0.1, foreach=False)
    pairs = torch.empty(nf * (nf - 1) // 2, dtype=torch.long, device=META)  # flat (i, j), i > j, of the 27 x 27 products
    unique = []  # distinct rows looked up a minibatch, per table
    with rec:
        rec.mark("embedding", tables)
        rec.mark("optimizer", accum)
        rec.mark("weight", dense_params + [pairs])
        for it in range(steps):
            rec.iteration(it)
            dense = torch.empty(batch, 13, device=META)
            ids = torch.empty(len(tables), batch, dtype=torch.long, device=META)
            label = torch.empty(batch, device=META)
            rec.partial_kernel("copy_batch_h2d", writes=[dense, ids, label])
            lookups = [power_law_rows(rng, r, DLRM_ZIPF, batch, salt=7919 * t) for t, r in enumerate(rows)]
            unique.append([len(set(x)) for x in lookups])
            embs = []
            for t, (tab, look) in enumerate(zip(tables, lookups)):
                e = torch.empty(batch, dim, device=META).requires_grad_()
                rec.partial_kernel("embedding_bag_forward", [ids[t], (tab, look)], [e])
                embs.append(e)
            xb = bottom(dense)
            feats = torch.stack([xb] + embs, dim=1)
            z = torch.bmm(feats, feats.transpose(1, 2)).view(batch, -1).index_select(1, pairs)
            logit = top(torch.cat([xb, z], dim=1)).squeeze(1)
            loss = F.binary_cross_entropy_with_logits(logit, label)
            loss.backward()
            for t, (tab, acc, look, e) in enumerate(zip(tables, accum, lookups, embs)):
                rec.partial_kernel("embedding_backward_rowwise_adagrad", [e.grad, ids[t], (tab, look), (acc, look)],
                                   [(tab, look), (acc, look)])
            opt.step()
            opt.zero_grad(set_to_none=True)
            del dense, ids, label, embs, e, xb, feats, z, logit, loss
    args.iters = steps
    args.header_extra = {
        "seed": DLRM_SEED, "zipf_exponent": DLRM_ZIPF, "table_rows": rows, "embedding_dim": dim,
        "mlp_bottom": (13,) + bottom_w, "mlp_top": top_w, "interaction": "dot",
        "distinct_rows_per_step": [sum(u) for u in unique],
        "partial_access": {"page_bytes": rec.PAGE, "max_ranges": rec.MAX_RANGES},
    }
    return tables, accum, bottom, top, opt, pairs


# The name this script answers to: `spillway trace torch` sets SPILLWAY_TRACE_PROG when it runs it.
PROG = os.environ.get("SPILLWAY_TRACE_PROG") or "trace_torch.py"


def die(message):
    """A bad command line or model: one line, status 2."""
    sys.stderr.write(f"{PROG}: {message}\n")
    sys.exit(2)


INPUT_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "long": torch.long}


def load_factory(spec):
    """MODULE:FACTORY -> the function; the current folder is searched first, as `python -m` does."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        die(f"'{spec}' is not MODULE:FACTORY (a built-in model, or a function that returns "
                         "a torch.nn.Module)")
    sys.path.insert(0, os.getcwd())
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
        die(f"cannot load {spec}: {e}")
    if not callable(fn):
        die(f"{spec} is not a function")
    return fn


def build_on_meta(factory):
    """The factory's module, its parameters on the meta device."""
    if hasattr(torch.device, "__enter__"):  # torch >= 2.0: factories make meta tensors directly
        with torch.device("meta"):
            model = factory()
    else:
        model = factory()
    if not isinstance(model, nn.Module):
        die(f"{factory.__module__}.{factory.__name__}() returned "
                         f"{type(model).__name__}, not a torch.nn.Module")
    return model.to(META)


def make_optimizer(model, name):
    """One tensor per kernel (foreach=False), as the built-in models record."""
    if name == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
    return torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9, foreach=False)


def module_trace(rec, args):
    """Your own model (MODULE:FACTORY): --iters training steps (mean of the output as the loss,
    the optimizer's step) or forward passes without gradients."""
    model = build_on_meta(load_factory(args.model))
    if not args.input_shape:
        die("--input-shape is required for MODULE:FACTORY (one per input of forward())")
    inputs = [torch.empty(shape, dtype=INPUT_DTYPES[args.input_dtype], device=META) for shape in args.input_shape]
    train = args.mode == "train"
    opt = make_optimizer(model, args.optimizer) if train else None
    with torch.set_grad_enabled(train), rec:
        rec.mark("weight", model.parameters())
        for it in range(args.iters):
            rec.iteration(it)
            try:
                out = model(*inputs)
            except Exception as e:  # (a shape or dtype the model does not take: the user's input)
                shapes = " ".join(",".join(map(str, s)) for s in args.input_shape)
                die(f"{args.model}'s forward() failed on inputs of shape {shapes} ({args.input_dtype}): "
                    f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            if train:
                loss = (out[0] if isinstance(out, (tuple, list)) else out).float().mean()
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                del loss
            del out
        if opt is not None:
            for st in opt.state.values():
                rec.mark("optimizer", [v for v in st.values() if isinstance(v, torch.Tensor)])
    args.batch = args.input_shape[0][0] if args.input_shape[0] else None
    args.header_extra = {"factory": args.model, "mode": args.mode, "input_shapes": args.input_shape,
                         "input_dtype": args.input_dtype, "optimizer": args.optimizer if train else None}
    return model, opt, inputs


def shape_arg(text):
    try:
        dims = [int(d) for d in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a list of whole dimensions such as 8,3,224,224")
    if not dims or any(d <= 0 for d in dims):
        raise argparse.ArgumentTypeError(f"'{text}': every dimension must be positive")
    return dims


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
    "vit-train": (vit_train, "Vision Transformer (ViT-B/16, ViT-L/16 shapes), 224x224 image classification, "
                             "bf16 training with fp32 master weights and AdamW", VIT_SIZES, "b16", 128),
    "unet-train": (unet_train, "Stable-Diffusion-style UNet (ResBlocks with GroupNorm, SiLU and timestep embedding, "
                               "self-attention at low resolutions, skip connections), one noise-prediction step per iteration, "
                               "bf16 training with fp32 master weights and AdamW", UNET_SIZES, "small", 32),
    "bert-finetune": (bert_finetune, "BERT (base, large shapes) fine-tuning for sequence classification with a head on [CLS], "
                                     "fp32 training with AdamW", BERT_SIZES, "base", 32),
    "moe-train": (moe_train, "Mixtral-style MoE decoder LM (top-2 routing over SwiGLU experts, skewed expert loads drawn "
                             "per step and layer), bf16 training with fp32 master weights and AdamW", MOE_SIZES, "8e", 8),
    "llm-serve-paged": (llm_serve_paged, "Llama-style decoder LM (1b, 3b shapes) serving with continuous batching over a "
                                         "paged KV cache (vLLM-style: one block pool, block tables, 16-token blocks, "
                                         "requests joining and leaving), bf16", SERVE_SIZES, "1b", 64),
    "gnn-train": (gnn_train, "GraphSAGE minibatch training with neighbour sampling (fanouts 15, 10) on ogbn-products/"
                             "ogbn-papers100M-sized graphs: features, labels and CSR in GPU memory, gathered by row, fp32 "
                             "with Adam", GNN_SIZES, "products", 1024),
    "dlrm-train": (dlrm_train, "DLRM (Criteo Kaggle, MLPerf Terabyte configurations): bottom MLP, 26 embedding tables "
                               "with Zipf-like lookups, dot interaction, top MLP; fp32, SGD for the MLPs, row-wise Adagrad "
                               "updating only the rows looked up", DLRM_SIZES, "kaggle", 2048),
}


def parse_args(argv):
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="a built-in model (" + ", ".join(sorted(MODELS)) + ") or MODULE:FACTORY, a function "
                   "that returns your torch.nn.Module")
    p.add_argument("out", help="the trace to write (.jsonl.gz: compressed)")
    p.add_argument("--batch", type=int, help="the built-in model's batch [per model]")
    p.add_argument("--seq", type=int, help="tokens a sequence [1024; bert-finetune: 128]")
    p.add_argument("--iters", type=int, default=3, help="training steps, or forward passes with --mode infer [3]")
    p.add_argument("--decode", type=int, default=32, help="decode steps after the prefill (gpt2-xl-infer) [32]")
    p.add_argument("--steps", type=int,
                   help="engine steps (llm-serve-paged) or minibatches (gnn-train, dlrm-train) [per size]")
    p.add_argument("--size", help="the model's size, for models that have sizes: " +
                   "; ".join(f"{m}: {', '.join(v[2])} [{v[3]}]" for m, v in sorted(MODELS.items()) if v[2]))
    p.add_argument("--tflops-fp32", type=float, default=494.7, help="dense TF32 tensor-core TFLOP/s [H200: 494.7]")
    p.add_argument("--tflops-half", type=float, default=989.0, help="dense BF16/FP16 TFLOP/s [H200: 989]")
    p.add_argument("--bandwidth-tbs", type=float, default=4.8, help="memory bandwidth, TB/s [H200: 4.8]")
    p.add_argument("--floor-us", type=float, default=4.0, help="minimum kernel time, us [4]")
    own = p.add_argument_group("MODULE:FACTORY (your own model)")
    own.add_argument("--input-shape", type=shape_arg, action="append", default=[],
                     help="one positional input of forward(), e.g. 8,3,224,224 (repeat for more inputs)")
    own.add_argument("--input-dtype", choices=sorted(INPUT_DTYPES), default="float32", help="[float32]")
    own.add_argument("--mode", choices=["train", "infer"], default="train", help="[train]")
    own.add_argument("--optimizer", choices=["adamw", "sgd"], default="adamw", help="in training [adamw]")
    a = p.parse_args(argv[1:])
    if ":" not in a.model and a.model not in MODELS:
        p.error(f"unknown model '{a.model}' (accepted: {', '.join(sorted(MODELS))}, or MODULE:FACTORY)")
    if ":" not in a.model and a.input_shape:
        p.error(f"--input-shape is for MODULE:FACTORY; {a.model} has its own inputs")
    return p, a


def main(argv):
    p, a = parse_args(argv)
    if ":" in a.model:
        return record(a, module_trace, f"your own torch.nn.Module, {a.mode}", None)
    fn, what, sizes, default_size, default_batch = MODELS[a.model]
    if sizes is None and a.size is not None:
        p.error(f"--size: {a.model} has one size")
    if sizes is not None:
        a.size = a.size or default_size
        if a.size not in sizes:
            p.error(f"--size: invalid value '{a.size}' for {a.model} (accepted: {', '.join(sizes)})")
    if a.batch is None:
        a.batch = default_batch
    if a.seq is None:
        a.seq = 128 if a.model == "bert-finetune" else 1024
    return record(a, fn, what, sizes)


def record(a, fn, what, sizes):
    """Runs model function `fn` under the recorder and writes the trace to a.out."""
    roof = Roofline(a.tflops_fp32 * 1e12, a.tflops_half * 1e12, a.bandwidth_tbs * 1e12, a.floor_us * 1e3)
    rec = Recorder(roof)
    keep = fn(rec, a)
    own = ":" in a.model
    header = {
        "format": "spillway-trace", "version": 1,
        "source": f"scripts/trace_torch.py {a.model}: {what}; torch {torch.__version__} on the meta device",
        "model": a.model if sizes is None else f"{a.model}-{a.size}", "batch": a.batch, "seq": None if own else a.seq,
        "iterations": a.iters if own or "train" in a.model or "finetune" in a.model else None,
        "decode_steps": a.decode if "infer" in a.model and not own else None,
        "roofline": {"tflops_fp32": a.tflops_fp32, "tflops_half": a.tflops_half, "bandwidth_tb_s": a.bandwidth_tbs,
                     "floor_us": a.floor_us, "figures": "NVIDIA H200 SXM datasheet (dense)"},
    }
    header.update(getattr(a, "header_extra", {}))  # a model's own figures: image size, expert loads, ...
    kernels = rec.write(a.out, header)
    del keep
    print(f"{a.out}: {kernels} kernels, {rec.next_id} storages; next: spillway sweep {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
