"""Deterministic PyTorch training loops whose tensor shapes vary, for memory benchmarks.

Usage: python3 workloads.py NAME [--steps N] [--warmup K] [--device cuda|cpu] [--small] [--seed S]
NAME: mlp, transformer, convnet, ddp (ddp: run it under torchrun, NCCL).

Each run prints one line (one per rank for ddp):
  RESULT name=NAME steps=N warmup=K wall_s=S final_loss=X peak_allocated=BYTES peak_reserved=BYTES
         max_tokens=... device=...
wall_s covers the N timed steps after K warm-up steps (the warm-up steps run the same
shape sequence and count for the memory peaks). peak_allocated and peak_reserved are
torch.cuda.max_memory_allocated()/max_memory_reserved(): only meaningful with PyTorch's
own cache (with PYTORCH_NO_CUDA_MEMORY_CACHING=1 PyTorch does not count, and they read 0).
Under poolshim (LD_PRELOAD) the line also holds what each quarter of the timed steps cost
it, read from the library while the loop runs (poolshim_stats_json, shim/poolshim.h; no
synchronize at the marks):
  shim_warm_maps=M shim_maps_q=A/B/C/D shim_unmaps_q=... shim_barriers_q=...
the map calls of the warm-up (remaps included), then map calls, unmap calls and barriers
per quarter: a loop in its steady state maps nothing in the last quarters.

The shapes of every step come from a seeded host RNG (random.Random), the data from a
seeded torch.Generator on the device: every allocator configuration sees the same
sequence of tensor sizes. The host runs ahead of the GPU: nothing inside the loop waits
for the GPU (no .item(), no synchronize); one loss.item() after the last step, then
torch.cuda.synchronize().

Sizes (defaults, fp32): transformer d_model 512, 8 heads, 6 layers, vocabulary 8192,
sequence 64..1024, batch 4..32 capped at 12288 tokens a step; convnet a ResNet-18-like net,
batch 8..96, 64..256 px. At the largest shapes the tensors saved for backward are ~2.8 GB
(transformer) and ~2.7 GB (convnet), as measured on the CPU with saved-tensor hooks; the
GPU peaks add gradients, optimizer state and workspaces. --small shrinks everything for a
dry run on the CPU.
"""
import argparse
import os
import random
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import benchlib  # noqa: E402  (tools/bench/benchlib.py)


def setup_determinism(seed):
    torch.manual_seed(seed)
    # warn_only: a few backward kernels (adaptive pooling, attention) have no deterministic
    # CUDA version; they warn once instead of failing. The losses are then equal across
    # allocators only up to that nondeterminism (and cuBLAS/cuDNN choices that depend on
    # pointer alignment).
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.deterministic = True
    # benchmark=True would time every new input shape: with shapes that vary each step that
    # is many extra kernels and workspace allocations; keep the heuristics.
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


# ------------------------------------------------------------------ mlp

class MLPWorkload:
    """The loop of tests/gpu/torch_train.py: fixed shapes, gradients freed every step."""

    def __init__(self, device, small, gen, rng, rank=0):
        width = 128 if small else 1024
        self.n_in = 64 if small else 512
        self.rows = 32 if small else 256
        self.model = nn.Sequential(
            nn.Linear(self.n_in, width), nn.ReLU(),
            nn.Linear(width, width), nn.ReLU(),
            nn.Linear(width, 10),
        ).to(device)
        batches = 4 if small else 64
        self.inputs = torch.randn(batches, self.rows, self.n_in, device=device, generator=gen)
        self.labels = torch.randint(0, 10, (batches, self.rows), device=device, generator=gen)
        self.max_tokens = self.rows

    def parameters(self):
        return self.model.parameters()

    def step_loss(self, step, rng):
        batch = step % self.inputs.shape[0]
        logits = self.model(self.inputs[batch])
        return F.cross_entropy(logits, self.labels[batch])


# ------------------------------------------------------------------ transformer

class TransformerLM(nn.Module):
    def __init__(self, vocab, d_model, heads, layers, ff, max_seq):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(max_seq, d_model)
        layer = nn.TransformerEncoderLayer(d_model, heads, ff, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        # enable_nested_tensor=False: the nested-tensor fast path only applies to inference
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, tokens, mask):
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.embed(tokens) + self.pos(positions)
        x = self.encoder(x, mask=mask, is_causal=True)
        return self.head(self.norm(x))


class TransformerWorkload:
    """A causal language model on random tokens; sequence length and batch size drawn
    per step (a new shape almost every step, the case that fragments caching allocators)."""

    def __init__(self, device, small, gen, rng, rank=0):
        if small:
            self.vocab, d_model, heads, layers, ff = 512, 64, 4, 2, 128
            self.seq_range, self.batch_range, self.max_tokens = (8, 64), (2, 4), 256
        else:
            # ~200 KB of saved activations a token (fp32) and 0.4 GB of logits at the cap:
            # ~2.8 GB saved at 12288 tokens (measured on the CPU with saved-tensor hooks)
            self.vocab, d_model, heads, layers, ff = 8192, 512, 8, 6, 2048
            self.seq_range, self.batch_range, self.max_tokens = (64, 1024), (4, 32), 12288
        self.device = device
        self.gen = gen
        self.model = TransformerLM(self.vocab, d_model, heads, layers, ff, self.seq_range[1]).to(device)

    def parameters(self):
        return self.model.parameters()

    def shape(self, rng):
        seq = rng.randint(*self.seq_range)
        batch = rng.randint(*self.batch_range)
        batch = max(1, min(batch, self.max_tokens // seq))  # cap the tokens of a step
        return batch, seq

    def step_loss(self, step, rng):
        batch, seq = self.shape(rng)
        # built every step, as training code usually does (at most 4 MB); is_causal=True
        # lets attention use its causal kernel rather than read the mask
        mask = nn.Transformer.generate_square_subsequent_mask(seq, device=self.device)
        data = torch.randint(0, self.vocab, (batch, seq + 1), device=self.device, generator=self.gen)
        logits = self.model(data[:, :-1], mask)
        return F.cross_entropy(logits.reshape(-1, self.vocab), data[:, 1:].reshape(-1))


# ------------------------------------------------------------------ convnet

class BasicBlock(nn.Module):
    def __init__(self, c_in, c_out, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.short = None
        if stride != 1 or c_in != c_out:
            self.short = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (x if self.short is None else self.short(x)))


class ResNetLike(nn.Module):
    def __init__(self, widths, blocks, classes):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 7, 2, 3, bias=False), nn.BatchNorm2d(widths[0]),
                                  nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        layers, c_in = [], widths[0]
        for i, (width, count) in enumerate(zip(widths, blocks)):
            for j in range(count):
                layers.append(BasicBlock(c_in, width, 2 if (j == 0 and i > 0) else 1))
                c_in = width
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(c_in, classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class ConvnetWorkload:
    """A ResNet-18-like classifier (cuDNN convolutions) on random images; batch size and
    resolution drawn per step."""

    def __init__(self, device, small, gen, rng, rank=0):
        if small:
            widths, blocks, self.classes = (8, 16, 32, 64), (1, 1, 1, 1), 10
            self.batch_range, self.res_range = (2, 4), (32, 64)
        else:
            widths, blocks, self.classes = (64, 128, 256, 512), (2, 2, 2, 2), 1000
            self.batch_range, self.res_range = (8, 96), (64, 256)
        self.device = device
        self.gen = gen
        self.model = ResNetLike(widths, blocks, self.classes).to(device)
        self.max_tokens = self.batch_range[1] * self.res_range[1] ** 2

    def parameters(self):
        return self.model.parameters()

    def step_loss(self, step, rng):
        batch = rng.randint(*self.batch_range)
        res = 16 * rng.randint(self.res_range[0] // 16, self.res_range[1] // 16)  # 64, 80, ..., 256
        images = torch.randn(batch, 3, res, res, device=self.device, generator=self.gen)
        labels = torch.randint(0, self.classes, (batch,), device=self.device, generator=self.gen)
        return F.cross_entropy(self.model(images), labels)


WORKLOADS = {"mlp": MLPWorkload, "transformer": TransformerWorkload, "convnet": ConvnetWorkload,
             "ddp": MLPWorkload, "ddp_transformer": TransformerWorkload}


def bytes_stat(fn, device):
    if device.type != "cuda":
        return 0
    try:
        return int(fn(device))
    except Exception:  # e.g. a backend that keeps no statistics
        return -1


def shim_figures():
    """(maps, unmaps, barriers) of the preloaded poolshim so far, summed over devices;
    None without the library. Its statistics as of now (benchlib.stats_now)."""
    doc = benchlib.stats_now()
    if doc is None:
        return None
    devices = doc.get("devices", [])
    cuda_time = [d.get("cuda_time", {}) for d in devices]
    return (sum(t.get("map", {}).get("calls", 0) for t in cuda_time),
            sum(t.get("unmap", {}).get("calls", 0) for t in cuda_time),
            sum(d.get("barriers_issued", d.get("barriers", 0)) for d in devices))


def quarter_fields(marks):
    """The RESULT fields of shim_figures() taken at the warm-up's start and end and
    after each quarter of the timed steps (six marks); '' without the library."""
    if any(m is None for m in marks):
        return ""
    delta = [[b - a for a, b in zip(marks[i], marks[i + 1])] for i in range(len(marks) - 1)]
    quarters = delta[1:]
    return (f" shim_warm_maps={delta[0][0]}" +
            "".join(f" shim_{name}_q=" + "/".join(str(q[k]) for q in quarters)
                    for k, name in enumerate(("maps", "unmaps", "barriers"))))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("name", choices=sorted(WORKLOADS))
    parser.add_argument("--steps", type=int, default=100, help="timed steps (default 100)")
    parser.add_argument("--warmup", type=int, default=5, help="steps before the clock starts (default 5)")
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu for a dry run")
    parser.add_argument("--small", action="store_true", help="tiny sizes (for a dry run on the CPU)")
    parser.add_argument("--seed", type=int, default=1234)
    args = parser.parse_args(argv)

    rank, world = 0, 1
    if args.name.startswith("ddp"):
        import torch.distributed as dist
        if "RANK" not in os.environ:
            sys.exit("workloads.py ddp: run it under torchrun (e.g. torchrun --nproc-per-node 2 workloads.py ddp)")
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local_rank = int(os.environ.get("LOCAL_RANK", rank))
        if args.device == "cuda":
            torch.cuda.set_device(local_rank)
            device = torch.device("cuda", local_rank)
            dist.init_process_group("nccl", device_id=device)
        else:
            device = torch.device(args.device)
            dist.init_process_group("gloo")
    else:
        device = torch.device(args.device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())

    setup_determinism(args.seed)
    rng = random.Random(args.seed + rank)  # the host RNG that draws the shapes
    gen = torch.Generator(device=device).manual_seed(args.seed + 1000 + rank)
    workload = WORKLOADS[args.name](device, args.small, gen, rng, rank)
    model_params = list(workload.parameters())
    step_model = None
    if args.name.startswith("ddp"):
        from torch.nn.parallel import DistributedDataParallel as DDP
        # DDP broadcasts rank 0's weights at construction; each rank draws its own data
        step_model = DDP(workload.model, device_ids=[device.index] if device.type == "cuda" else None)
        workload.model = step_model
        model_params = list(step_model.parameters())
    optimizer = torch.optim.AdamW(model_params, lr=1e-3)

    def run(first, count):
        loss = None
        for step in range(first, first + count):
            optimizer.zero_grad(set_to_none=True)  # gradients freed and reallocated every step
            loss = workload.step_loss(step, rng)
            loss.backward()
            optimizer.step()
        return loss

    marks = [shim_figures()]
    loss = run(0, args.warmup)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    marks.append(shim_figures())
    start = time.perf_counter()
    # the timed steps in quarters, the library read between them (no synchronize)
    bounds = [args.warmup + args.steps * k // 4 for k in range(5)]
    for first, last in zip(bounds, bounds[1:]):
        if last > first:
            loss = run(first, last - first)
        marks.append(shim_figures())
    final = loss.item() if loss is not None else float("nan")
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    wall = time.perf_counter() - start
    peak_alloc = bytes_stat(torch.cuda.max_memory_allocated, device)
    peak_res = bytes_stat(torch.cuda.max_memory_reserved, device)
    name = (torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu").replace(" ", "_")
    rank_field = f" rank={rank} world={world}" if args.name.startswith("ddp") else ""
    print(f"RESULT name={args.name}{rank_field} steps={args.steps} warmup={args.warmup} wall_s={wall:.3f} "
          f"final_loss={final:.10e} peak_allocated={peak_alloc} peak_reserved={peak_res} "
          f"max_tokens={workload.max_tokens} small={int(args.small)} device={name}{quarter_fields(marks)}",
          flush=True)
    if args.name.startswith("ddp"):
        import torch.distributed as dist
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
