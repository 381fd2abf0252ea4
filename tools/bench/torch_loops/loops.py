"""PyTorch loops as users write them, for timing and memory side by side.

Each loop keeps PyTorch's default settings (cuDNN heuristics, TF32 as shipped,
non-deterministic kernels allowed) and draws its shapes every step from a seeded host
RNG, so every allocator configuration sees the same sequence of shapes:

  convsmall   3 conv+BN layers, batch 16-96, resolution 64-160 (allocation-bound)
  resnet      torchvision ResNet-18, batch 16-48, resolution 64-160
  transformer 4 encoder layers d512, sequence 64-512, batch 8-24, AdamW
  mlp         3 linear layers 1024 wide, batch 64-1024, Adam
  serve       inference (inference_mode) of a 6-layer encoder, batch 1-64, sequence 16-256
  autocast    bf16 autocast training of a 4-layer encoder d512, sequence 64-256, batch 4-16
  compiled    torch.compile'd 2-layer encoder d256, sequence 32-256, batch 8-32
  loader      a conv net fed by a DataLoader (2 workers, pinned memory, non_blocking
              copies), batch 16-96 drawn per batch

Usage (one loop in this process):
  python3 loops.py NAME --steps N [--seed S] [--device cuda|cpu] [--small] [--poolshim-torch LIB]
  python3 loops.py --serve        (the fork server of run_set.py: reads commands on stdin)
  python3 loops.py --list

A run prints one line, RESULT {json}: wall_s (the whole run: CUDA initialisation, the
model's construction, every step and the final synchronize), steady_s (the last half
of the steps, between two synchronizes), first_s (the first step), final_loss, and under
poolshim the map calls, unmap calls and barriers of the library in the first half and in
each quarter of the second half (read with poolshim_stats_json while the loop runs; no
synchronize at those marks).

--poolshim-torch LIB routes PyTorch's allocations through poolshim.torch (python/poolshim/
torch.py, a CUDAPluggableAllocator over LIB) before the first CUDA call.
"""
import argparse
import ctypes
import json
import os
import random
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import benchlib  # noqa: E402  (tools/bench/benchlib.py)

LOOPS = ("convsmall", "resnet", "transformer", "mlp", "serve", "autocast", "compiled", "loader")


# --------------------------------------------------------------------- the library's figures

def shim_figures():
    """(maps, unmaps, barriers) of the poolshim loaded in this process so far, summed over
    devices; None without it (poolshim_stats_json, shim/poolshim.h)."""
    doc = benchlib.stats_now(os.environ.get("POOLSHIM_TORCH_LIBRARY"))
    if doc is None:
        return None
    maps = unmaps = barriers = 0
    for dev in doc.get("devices", []):
        up = dev.get("upstream", {})
        maps += up.get("allocs", 0)
        unmaps += up.get("frees", 0)
        barriers += dev.get("barriers_issued", 0)
    return maps, unmaps, barriers


# --------------------------------------------------------------------- the loops

class Loop:
    """A loop: __init__ builds the model and optimizer; step(i) runs one step and returns
    the loss tensor (never read inside the loop: the host runs ahead of the GPU)."""

    def __init__(self, torch, device, small, rng, gen):
        self.torch, self.device, self.small, self.rng, self.gen = torch, device, small, rng, gen

    def randn(self, *shape, dtype=None):
        return self.torch.randn(*shape, device=self.device, generator=self.gen, dtype=dtype)

    def randint(self, high, shape):
        return self.torch.randint(0, high, shape, device=self.device, generator=self.gen)

    def close(self):
        pass


def conv_block(nn, cin, cout, stride):
    return [nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]


class ConvSmall(Loop):
    def __init__(self, *a):
        super().__init__(*a)
        nn = self.torch.nn
        self.net = nn.Sequential(*conv_block(nn, 3, 32, 1), *conv_block(nn, 32, 64, 2), *conv_block(nn, 64, 128, 2),
                                 nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10)).to(self.device)
        self.opt = self.torch.optim.SGD(self.net.parameters(), lr=0.01, momentum=0.9)

    def step(self, i):
        b = self.rng.randint(2, 6) if self.small else self.rng.randint(16, 96)
        r = self.rng.randint(8, 16) if self.small else self.rng.randint(64, 160)
        x = self.randn(b, 3, r, r)
        y = self.randint(10, (b,))
        loss = self.torch.nn.functional.cross_entropy(self.net(x), y)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        return loss


class ResNet(Loop):
    def __init__(self, *a):
        super().__init__(*a)
        import torchvision
        self.net = torchvision.models.resnet18(num_classes=100).to(self.device)
        self.opt = self.torch.optim.SGD(self.net.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)

    def step(self, i):
        b = self.rng.randint(2, 4) if self.small else self.rng.randint(16, 48)
        r = self.rng.randint(32, 48) if self.small else self.rng.randint(64, 160)
        x = self.randn(b, 3, r, r)
        y = self.randint(100, (b,))
        loss = self.torch.nn.functional.cross_entropy(self.net(x), y)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        return loss


class Encoder(Loop):
    """A token model: embedding, encoder layers, a language-model head."""
    vocab = 8192

    def build(self, d, layers, heads):
        nn = self.torch.nn
        if self.small:
            d, layers, heads, self.vocab = 32, 1, 2, 128
        self.embed = nn.Embedding(self.vocab, d).to(self.device)
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.1, batch_first=True)
        self.body = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False).to(self.device)
        self.head = nn.Linear(d, self.vocab).to(self.device)
        self.params = [*self.embed.parameters(), *self.body.parameters(), *self.head.parameters()]

    def forward_loss(self, tokens):
        logits = self.head(self.body(self.embed(tokens)))
        return self.torch.nn.functional.cross_entropy(logits.reshape(-1, self.vocab).float(),
                                                      tokens.reshape(-1))

    def shape(self, batch, seq):
        if self.small:
            return self.rng.randint(2, 4), self.rng.randint(8, 16)
        return self.rng.randint(*batch), self.rng.randint(*seq)


class Transformer(Encoder):
    def __init__(self, *a):
        super().__init__(*a)
        self.build(512, 4, 8)
        self.opt = self.torch.optim.AdamW(self.params, lr=1e-4)

    def step(self, i):
        b, s = self.shape((8, 24), (64, 512))
        loss = self.forward_loss(self.randint(self.vocab, (b, s)))
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        return loss


class Serve(Encoder):
    def __init__(self, *a):
        super().__init__(*a)
        self.build(512, 6, 8)
        self.body.eval()

    def step(self, i):
        b, s = self.shape((1, 64), (16, 256))
        with self.torch.inference_mode():
            logits = self.head(self.body(self.embed(self.randint(self.vocab, (b, s)))))
            return logits.float().softmax(-1).amax()


class Autocast(Encoder):
    def __init__(self, *a):
        super().__init__(*a)
        self.build(512, 4, 8)
        self.opt = self.torch.optim.AdamW(self.params, lr=1e-4)

    def step(self, i):
        b, s = self.shape((4, 16), (64, 256))
        tokens = self.randint(self.vocab, (b, s))
        with self.torch.autocast(device_type=self.device.type, dtype=self.torch.bfloat16):
            loss = self.forward_loss(tokens)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        return loss


class Compiled(Encoder):
    def __init__(self, *a):
        super().__init__(*a)
        self.build(256, 2, 4)
        self.compiled = self.torch.compile(self.forward_loss)
        self.opt = self.torch.optim.AdamW(self.params, lr=1e-4)

    def step(self, i):
        b, s = self.shape((8, 32), (32, 256))
        loss = self.compiled(self.randint(self.vocab, (b, s)))
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        return loss


class MLP(Loop):
    def __init__(self, *a):
        super().__init__(*a)
        nn = self.torch.nn
        w = 64 if self.small else 1024
        self.n_in = 32 if self.small else 512
        self.net = nn.Sequential(nn.Linear(self.n_in, w), nn.ReLU(), nn.Linear(w, w), nn.ReLU(),
                                 nn.Linear(w, 10)).to(self.device)
        self.opt = self.torch.optim.Adam(self.net.parameters(), lr=1e-3)

    def step(self, i):
        b = self.rng.randint(4, 16) if self.small else self.rng.randint(64, 1024)
        x = self.randn(b, self.n_in)
        y = self.randint(10, (b,))
        loss = self.torch.nn.functional.cross_entropy(self.net(x), y)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        return loss


class ImageSet:
    """Synthetic uint8 images made on the CPU by the DataLoader's workers (seeded per index)."""

    def __init__(self, torch, n, res):
        self.torch, self.n, self.res = torch, n, res

    def __len__(self):
        return self.n

    def __getitem__(self, index):
        g = self.torch.Generator().manual_seed(index)
        image = self.torch.randint(0, 256, (3, self.res, self.res), dtype=self.torch.uint8, generator=g)
        return image, index % 10


class Loader(Loop):
    def __init__(self, *a, steps=1):
        super().__init__(*a)
        nn = self.torch.nn
        self.net = nn.Sequential(*conv_block(nn, 3, 32, 1), *conv_block(nn, 32, 64, 2), *conv_block(nn, 64, 128, 2),
                                 *conv_block(nn, 128, 128, 2), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                                 nn.Linear(128, 10)).to(self.device)
        self.opt = self.torch.optim.SGD(self.net.parameters(), lr=0.01, momentum=0.9)
        res = 16 if self.small else 128
        sizes = [self.rng.randint(2, 6) if self.small else self.rng.randint(16, 96) for _ in range(steps)]
        batches, start = [], 0
        for size in sizes:
            batches.append(list(range(start, start + size)))
            start += size
        pin = self.device.type == "cuda"
        self.loader = self.torch.utils.data.DataLoader(ImageSet(self.torch, start, res), batch_sampler=batches,
                                                       num_workers=2, pin_memory=pin, persistent_workers=False)
        self.batches = iter(self.loader)
        self.mean = self.torch.tensor([0.485, 0.456, 0.406], device=self.device).view(1, 3, 1, 1) * 255
        self.std = self.torch.tensor([0.229, 0.224, 0.225], device=self.device).view(1, 3, 1, 1) * 255

    def step(self, i):
        images, labels = next(self.batches)
        x = (images.to(self.device, non_blocking=True).float() - self.mean) / self.std
        y = labels.to(self.device, non_blocking=True)
        loss = self.torch.nn.functional.cross_entropy(self.net(x), y)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        return loss

    def close(self):
        self.batches = None
        self.loader = None


CLASSES = {"convsmall": ConvSmall, "resnet": ResNet, "transformer": Transformer, "mlp": MLP,
           "serve": Serve, "autocast": Autocast, "compiled": Compiled, "loader": Loader}


# --------------------------------------------------------------------- one run

def run(name, steps, seed, device_name, small, torch_library=None):
    """Runs loop NAME for STEPS steps in this process; returns the result dict."""
    t_start = time.perf_counter()
    if torch_library:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "python"))
        import poolshim.torch as poolshim_torch  # noqa: E402  (python/poolshim/torch.py)
        poolshim_torch.enable(torch_library)
        os.environ["POOLSHIM_TORCH_LIBRARY"] = torch_library
    import torch
    device = torch.device(device_name)
    if device.type == "cuda":
        torch.cuda.init()
        torch.cuda.synchronize()
    t_cuda = time.perf_counter()
    torch.manual_seed(seed)
    rng = random.Random(seed)
    gen = torch.Generator(device=device).manual_seed(seed)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    args = (torch, device, small, rng, gen)
    loop = CLASSES[name](*args, steps=steps) if name == "loader" else CLASSES[name](*args)
    half = steps // 2
    quarter_marks = {half + (steps - half) * k // 4 for k in range(1, 4)}
    figures = [shim_figures()]
    first_s = steady_s = None
    t_half = None
    loss = None
    for i in range(steps):
        if i == half:
            sync()
            t_half = time.perf_counter()
            figures.append(shim_figures())
        elif i in quarter_marks:
            figures.append(shim_figures())
        loss = loop.step(i)
        if i == 0:
            sync()
            first_s = time.perf_counter() - t_start
    final_loss = float(loss.item()) if loss is not None else float("nan")
    sync()
    t_end = time.perf_counter()
    figures.append(shim_figures())
    loop.close()
    if t_half is not None:
        steady_s = t_end - t_half
    result = {"loop": name, "steps": steps, "seed": seed, "wall_s": t_end - t_start,
              "cuda_init_s": t_cuda - t_start, "first_s": first_s, "steady_s": steady_s,
              "steady_steps": steps - half, "final_loss": final_loss}
    if figures[0] is not None and all(f is not None for f in figures):
        # figures: start, half, 3 quarter marks, end -> maps/unmaps/barriers per segment
        segments = [tuple(b - a for a, b in zip(figures[k], figures[k + 1])) for k in range(len(figures) - 1)]
        result["shim"] = {"maps": [s[0] for s in segments], "unmaps": [s[1] for s in segments],
                          "barriers": [s[2] for s in segments], "total_maps": figures[-1][0],
                          "total_unmaps": figures[-1][1], "total_barriers": figures[-1][2]}
    if device.type == "cuda":
        try:
            result["torch_peak_reserved"] = torch.cuda.max_memory_reserved()
        except RuntimeError as exc:  # an external allocator has no statistics of PyTorch's
            result["torch_stats_error"] = str(exc).splitlines()[0][:200]
    return result


# --------------------------------------------------------------------- the fork server

def serve():
    """Imports torch (and torchvision) once, then for every line `run NAME STEPS SEED OUT
    DEVICE SMALL LIB|- [VAR=VALUE...]` on stdin forks a child (the variables set in it) that runs the loop in a fresh CUDA process
    and writes its result (JSON) to OUT; answers `done RC` on stdout. CUDA is never
    initialised in this process, so each child starts CUDA afresh, with this process's
    environment (allocator settings, LD_PRELOAD)."""
    import torch  # noqa: F401
    try:
        import torchvision  # noqa: F401
    except ImportError:
        pass
    assert not torch.cuda.is_initialized()
    print("ready", flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "quit":
            break
        _, name, steps, seed, out, device, small = words[:7]
        lib = words[7] if len(words) > 7 and words[7] != "-" else None
        extra = dict(w.split("=", 1) for w in words[8:])
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            os.dup2(2, 1)  # stdout is the command channel: the child's prints go to the log
            os.environ.update(extra)
            code = 0
            try:
                result = run(name, int(steps), int(seed), device, small == "1", lib)
                with open(out, "w") as f:
                    json.dump(result, f)
            except BaseException as exc:  # noqa: BLE001: the child reports every failure
                import traceback
                traceback.print_exc()
                with open(out + ".error", "w") as f:
                    f.write(repr(exc))
                code = 1
            sys.stdout.flush()
            sys.stderr.flush()
            # exit(3), not os._exit: the C library's exit handlers run, so the shim writes
            # its log and statistics; Python's own are not run again in the child.
            ctypes.CDLL(None).exit(code)
        _, status = os.waitpid(pid, 0)
        rc = os.waitstatus_to_exitcode(status)
        print("done %d" % rc, flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", nargs="?", choices=LOOPS)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--device", default="cuda")
    p.add_argument("--small", action="store_true")
    p.add_argument("--poolshim-torch", metavar="LIB")
    p.add_argument("--serve", action="store_true")
    p.add_argument("--list", action="store_true")
    a = p.parse_args()
    if a.list:
        print(" ".join(LOOPS))
        return 0
    if a.serve:
        serve()
        return 0
    if not a.name:
        p.error("name a loop (or --serve, --list)")
    print("RESULT " + json.dumps(run(a.name, a.steps, a.seed, a.device, a.small, a.poolshim_torch)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
