#!/usr/bin/env python3
"""A GPT-style decoder trained with AdamW, knowing nothing of Spillway.

Token embedding + learned positions, N pre-LayerNorm blocks (causal multi-head
self-attention + GELU MLP), a final LayerNorm and an LM head tied to the embedding (or
not: --untied), all from torch.nn, random init (normal 0.02, GPT-2 style), fp32. Trains
on one fixed batch of random tokens (the "overfit one batch" check: the loss has to go
down, which shows the run computed the right thing), a few warm-up steps then timed
steps, each timed between two torch.cuda.synchronize(). No downloads.

    python3 torch_gpt_train.py [--target-bytes 8GiB] [--layers 12 --d-model 1024 --heads 16
                               --seq 1024 --vocab 32000 --batch B] [--warmup 2 --steps 3]
                               [--device cuda|cpu] [--time-limit S] [--plan]
    python3 torch_gpt_train.py --device cpu --layers 2 --d-model 64 --heads 4 --seq 32 --batch 4 --steps 3

--target-bytes picks the batch size (when --batch is not given) whose estimated peak
training memory is closest to the target: parameters, gradients and AdamW's two moments
(16 bytes per parameter in fp32) plus the activations autograd keeps per sample (counted
tensor by tensor below) plus the largest transient. On CUDA the run reports
torch.cuda.max_memory_allocated() beside the estimate. --plan prints the configuration and
the estimate without running anything (no device needed).

Output: one JSON line (`{"workload": "torch_gpt_train", ...}`: config, parameter count,
estimate, peak memory, warm-up and timed step times in ms, median step, losses, whether
the parameters are managed memory), then one human line. Before every step and after the
last one a marker kernel (torch.cuda._sleep, "spin_kernel") is launched, so a trace
recorded under `spillway run --trace` shows where each step begins. Exit status: 0 if the
losses are finite and the last is below the first (or fewer than two steps ran), 1 if not,
77 if the device is missing, 2 on bad arguments.
"""
import argparse
import ctypes
import json
import math
import signal
import sys
import time

from workload_sizes import size


def gib(b):
    return b / 2**30


# ---------------------------------------------------------------------------------------
# Sizes (fp32, 4 bytes per element), without torch: --plan works anywhere.


def param_count(c):
    C, m = c["d_model"], c["mlp_ratio"]
    per_layer = (4 + 2 * m) * C * C + (9 + m) * C  # qkv, proj, fc, out weights + biases + 2 LNs
    n = c["vocab"] * C + c["seq"] * C + c["layers"] * per_layer + 2 * C
    if c["untied"]:
        n += c["vocab"] * C
    return n


def activation_bytes_per_sample(c):
    """Bytes autograd keeps for one sample at the end of the forward pass.

    Per block and token: the block input x (kept by ln1), ln1's output (kept by qkv), the
    qkv output (k and v are views of it), q*scale, the attention output made contiguous
    (kept by proj), the residual sum (kept by ln2), ln2's output (kept by fc), fc's output
    (kept by GELU) and GELU's output (kept by out): (9 + 2m)·C floats; with math attention
    also the softmax output, heads·T floats (the T×T scores, per head). After the blocks:
    ln_f's input and output and log_softmax's output (vocab floats per token).
    """
    C, T, m, h = c["d_model"], c["seq"], c["mlp_ratio"], c["heads"]
    per_token = (9 + 2 * m) * C + (h * T if c["attention"] == "math" else 0)
    return 4 * T * (c["layers"] * per_token + 2 * C + c["vocab"])


def transient_bytes_per_sample(c):
    """The largest short-lived tensors beyond the kept ones, per sample: the logits and
    their gradient at the start of backward (2·T·vocab), or with math attention two T×T
    score tensors per head (forward: scores + softmax; backward: their gradients)."""
    T, h = c["seq"], c["heads"]
    return 4 * max(2 * T * c["vocab"], 2 * h * T * T if c["attention"] == "math" else 0)


def estimate_bytes(c, batch=None):
    b = c["batch"] if batch is None else batch
    return 16 * param_count(c) + b * (activation_bytes_per_sample(c) + transient_bytes_per_sample(c))


def pick_batch(c, target):
    """The batch size (>= 1) whose estimate is closest to target."""
    fixed = 16 * param_count(c)
    per = activation_bytes_per_sample(c) + transient_bytes_per_sample(c)
    b = max(1, round((target - fixed) / per))
    return b


# ---------------------------------------------------------------------------------------


def build_model(torch, c, device=None):
    """The model, its parameters made on `device` (initialised there: no host copy)."""
    nn = torch.nn
    on = {"device": device}
    F = torch.nn.functional
    sdpa = getattr(F, "scaled_dot_product_attention", None)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            C, m = c["d_model"], c["mlp_ratio"]
            self.heads = c["heads"]
            self.ln1 = nn.LayerNorm(C, **on)
            self.qkv = nn.Linear(C, 3 * C, **on)
            self.proj = nn.Linear(C, C, **on)
            self.ln2 = nn.LayerNorm(C, **on)
            self.fc = nn.Linear(C, m * C, **on)
            self.act = nn.GELU()
            self.out = nn.Linear(m * C, C, **on)

        def forward(self, x, mask):
            B, T, C = x.shape
            h = self.heads
            q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
            q = q.view(B, T, h, C // h).transpose(1, 2)
            k = k.view(B, T, h, C // h).transpose(1, 2)
            v = v.view(B, T, h, C // h).transpose(1, 2)
            if c["attention"] == "sdpa":
                y = sdpa(q, k, v, is_causal=True)
            else:
                att = (q * (1.0 / math.sqrt(C // h))) @ k.transpose(-2, -1)
                att = att.masked_fill_(mask[:T, :T], float("-inf")).softmax(dim=-1)
                y = att @ v
            x = x + self.proj(y.transpose(1, 2).contiguous().view(B, T, C))
            return x + self.out(self.act(self.fc(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            V, C, T = c["vocab"], c["d_model"], c["seq"]
            self.tok = nn.Embedding(V, C, **on)
            self.pos = nn.Embedding(T, C, **on)
            self.blocks = nn.ModuleList([Block() for _ in range(c["layers"])])
            self.ln_f = nn.LayerNorm(C, **on)
            self.head = nn.Linear(C, V, bias=False, **on)
            if not c["untied"]:
                self.head.weight = self.tok.weight
            for mod in self.modules():
                if isinstance(mod, (nn.Linear, nn.Embedding)):
                    nn.init.normal_(mod.weight, mean=0.0, std=0.02)
                if isinstance(mod, nn.Linear) and mod.bias is not None:
                    nn.init.zeros_(mod.bias)
            # True above the diagonal: the future a position may not attend to.
            self.register_buffer("mask", torch.ones(T, T, dtype=torch.bool).triu(1).to(device), persistent=False)

        def forward(self, idx):
            B, T = idx.shape
            x = self.tok(idx) + self.pos(torch.arange(T, device=idx.device))
            for blk in self.blocks:
                x = blk(x, self.mask)
            return self.head(self.ln_f(x))

    return GPT()


def is_managed(ptr):
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    value = ctypes.c_uint(0)
    CU_POINTER_ATTRIBUTE_IS_MANAGED = 8
    rc = cuda.cuPointerGetAttribute(ctypes.byref(value), CU_POINTER_ATTRIBUTE_IS_MANAGED, ctypes.c_uint64(ptr))
    return rc == 0 and value.value == 1


def peak_rss_bytes():
    try:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    except Exception:  # pragma: no cover - not Linux
        return None


def median(xs):
    s = sorted(xs)
    n = len(s)
    if n == 0:
        return None
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--d-model", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--mlp-ratio", type=int, default=4)
    ap.add_argument("--batch", type=int, default=None, help="batch size [from --target-bytes, else 1]")
    ap.add_argument("--target-bytes", type=size, default=None, help="pick the batch size whose estimated peak is closest to this, e.g. 8GiB")
    ap.add_argument("--untied", action="store_true", help="an LM head of its own instead of the embedding's transpose")
    ap.add_argument("--attention", choices=["math", "sdpa"], default="math",
                    help="math: explicit softmax(QK^T)V, keeps T×T scores (any torch); sdpa: F.scaled_dot_product_attention (torch 2)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first [2]")
    ap.add_argument("--steps", type=int, default=3, help="timed steps [3]")
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--adam", choices=["default", "foreach", "loop"], default="default",
                    help="AdamW's implementation: torch's default, multi-tensor (foreach) kernels, or one tensor at a time")
    ap.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--time-limit", type=float, default=None,
                    help="stop after the step that ends past this many seconds from the start (results say stopped_early)")
    ap.add_argument("--plan", action="store_true", help="print the configuration and memory estimate, run nothing")
    args = ap.parse_args()

    for name in ("layers", "d_model", "heads", "seq", "vocab", "mlp_ratio"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.d_model % args.heads:
        ap.error(f"--d-model {args.d_model} is not a multiple of --heads {args.heads}")
    if args.batch is not None and args.batch < 1:
        ap.error("--batch must be at least 1")
    if args.warmup < 0 or args.steps < 1:
        ap.error("--warmup must be >= 0 and --steps >= 1")

    cfg = {
        "layers": args.layers, "d_model": args.d_model, "heads": args.heads, "seq": args.seq,
        "vocab": args.vocab, "mlp_ratio": args.mlp_ratio, "untied": args.untied, "attention": args.attention,
        "batch": args.batch or 1, "warmup": args.warmup, "steps": args.steps, "lr": args.lr, "adam": args.adam, "seed": args.seed,
    }
    if args.batch is None and args.target_bytes is not None:
        cfg["batch"] = pick_batch(cfg, args.target_bytes)
    result = {
        "workload": "torch_gpt_train",
        "config": cfg,
        "params": param_count(cfg),
        "target_bytes": args.target_bytes,
        "estimate_bytes": estimate_bytes(cfg),
    }
    if args.plan:
        print(json.dumps(result))
        print(f"plan: {describe(cfg)}, {result['params'] / 1e6:.1f} M parameters, "
              f"estimated peak {gib(result['estimate_bytes']):.2f} GiB")
        return 0

    t_start = time.perf_counter()
    try:
        import torch
    except ImportError as e:
        print(f"torch_gpt_train: no PyTorch in {sys.executable} ({e})", file=sys.stderr)
        return 77

    if args.attention == "sdpa" and not hasattr(torch.nn.functional, "scaled_dot_product_attention"):
        print(f"torch_gpt_train: --attention sdpa needs torch 2 (this is {torch.__version__})", file=sys.stderr)
        return 2
    dev_name = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(dev_name)
    cuda = device.type == "cuda"
    if cuda and not torch.cuda.is_available():
        print("torch_gpt_train: no CUDA device", file=sys.stderr)
        return 77
    result["torch"] = torch.__version__
    result["device"] = torch.cuda.get_device_name(device) if cuda else "cpu"

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    # Marks a step boundary in a recorded trace: one tiny kernel of a name used nowhere else.
    sleep = getattr(torch.cuda, "_sleep", None) if cuda else None

    def marker():
        if sleep is not None:
            sleep(1)

    torch.manual_seed(args.seed)
    t0 = time.perf_counter()
    model = build_model(torch, cfg, device)
    assert sum(p.numel() for p in model.parameters()) == result["params"], "parameter count formula out of date"
    foreach = {"default": None, "foreach": True, "loop": False}[args.adam]
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1,
                            **({} if foreach is None else {"foreach": foreach}))
    gen = torch.Generator().manual_seed(args.seed + 1)
    data = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["seq"] + 1), generator=gen).to(device)
    inputs, targets = data[:, :-1], data[:, 1:]
    sync()
    init_s = time.perf_counter() - t0

    F = torch.nn.functional
    losses, times_ms = [], []
    stopped_early = terminated = False

    class Terminated(Exception):
        pass

    def on_term(signum, frame):
        raise Terminated()

    # SIGTERM (timeout(1)) ends the loop, not the process: the results so far are printed and
    # the process exits normally, so a preloaded shim still writes its report and trace.
    signal.signal(signal.SIGTERM, on_term)
    t_loop = time.perf_counter()
    try:
        for i in range(cfg["warmup"] + cfg["steps"]):
            marker()
            sync()
            t = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            logits = model(inputs)
            loss = F.cross_entropy(logits.view(-1, cfg["vocab"]), targets.reshape(-1))
            del logits  # log_softmax keeps what backward needs
            loss.backward()
            opt.step()
            losses.append(loss.item())  # synchronizes too
            sync()
            times_ms.append((time.perf_counter() - t) * 1e3)
            del loss
            if (args.time_limit is not None and time.perf_counter() - t_start > args.time_limit
                    and i + 1 < cfg["warmup"] + cfg["steps"]):
                stopped_early = True
                break
    except Terminated:
        stopped_early = terminated = True
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    marker()
    sync()
    loop_s = time.perf_counter() - t_loop

    if len(losses) > len(times_ms):  # SIGTERM between the loss and the step's end
        losses.pop()
    warm = times_ms[: cfg["warmup"]]
    timed = times_ms[cfg["warmup"]:]
    finite = all(math.isfinite(x) for x in losses)
    decreased = len(losses) < 2 or losses[-1] < losses[0]
    result.update({
        "warmup_ms": [round(x, 3) for x in warm],
        "step_ms": [round(x, 3) for x in timed],
        "median_step_ms": round(median(timed), 3) if timed else None,
        "steps_done": len(times_ms),
        "stopped_early": stopped_early,
        "terminated": terminated,
        "losses": [round(x, 5) for x in losses],
        "loss_first": losses[0] if losses else None,
        "loss_last": losses[-1] if losses else None,
        "loss_finite": finite,
        "loss_decreased": decreased,
        "init_s": round(init_s, 3),
        "loop_s": round(loop_s, 3),
        "total_s": round(time.perf_counter() - t_start, 3),
        "step_markers": sleep is not None,
    })
    if cuda:
        result["peak_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
        result["peak_reserved_bytes"] = torch.cuda.max_memory_reserved(device)
        ptrs = [p.data_ptr() for p in model.parameters()]
        result["params_managed"] = f"{sum(is_managed(p) for p in ptrs)}/{len(ptrs)}"
    else:
        result["peak_rss_bytes"] = peak_rss_bytes()
    ok = finite and decreased and bool(losses)
    result["ok"] = ok
    print(json.dumps(result), flush=True)

    peak = result.get("peak_allocated_bytes")
    mem = (f"peak allocated {gib(peak):.2f} GiB (estimate {gib(result['estimate_bytes']):.2f})" if peak is not None
           else f"estimate {gib(result['estimate_bytes']):.2f} GiB")
    med = result["median_step_ms"]
    loss = f"loss {losses[0]:.4f} -> {losses[-1]:.4f}" if losses else "no step finished"
    managed = f"managed {result['params_managed']}; " if cuda else ""
    verdict = ("OK" if ok else "NO RESULT" if not losses
               else "WRONG: loss " + ("not finite" if not finite else "did not go down"))
    print(f"torch {torch.__version__} {dev_name}: {describe(cfg)}; {len(timed)} timed steps, median "
          f"{'n/a' if med is None else f'{med / 1e3:.3f} s'}{' (stopped early)' if stopped_early else ''}; {mem}; "
          f"{loss}; {managed}{verdict}")
    return 0 if ok else 1


def describe(c):
    return (f"GPT {c['layers']}L d{c['d_model']} h{c['heads']} T{c['seq']} V{c['vocab']} batch {c['batch']}"
            f"{' untied' if c['untied'] else ''}{' sdpa' if c['attention'] == 'sdpa' else ''}")


if __name__ == "__main__":
    sys.exit(main())
