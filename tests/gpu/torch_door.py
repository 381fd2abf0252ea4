"""poolshim.torch on a GPU: PyTorch with its allocator replaced by the torch door
(python/poolshim/torch.py, shim/hooks_torch.c).

    python3 tests/gpu/torch_door.py LIB record     Tensor.record_stream is honoured
    python3 tests/gpu/torch_door.py LIB train      a training loop: same loss as PyTorch's own
    python3 tests/gpu/torch_door.py - record       the same checks with PyTorch's own allocator

record: a tensor x on the default stream is read on a side stream after a spin
(torch.cuda._sleep) into a tensor made on the default stream (so the door hears of the
side stream only through record_stream), x.record_stream(side), del x; the next tensor of
its size on the default stream must get x's memory (checked: else the test says it proved
nothing) and is written at once. Unless the barrier that releases x waits for the side
stream, the write lands before the side stream read x, and its result is wrong:
POOLSHIM_TEST_TORCH_NO_JOIN=1 (the negative control: record_stream ignored) must make this
test fail. Exit 0: the checks passed; 1: a check failed;
3: the test could not show anything (no reuse).
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))


def main():
    lib, what = sys.argv[1], sys.argv[2]
    if lib != "-":
        import poolshim.torch
        poolshim.torch.enable(lib)
    import torch
    torch.manual_seed(0)
    if what == "record":
        return record(torch)
    if what == "train":
        return train(torch)
    print("unknown case %s" % what)
    return 2


def record(torch):
    n = 64 << 20  # floats: 256 MiB
    side = torch.cuda.Stream()
    failures = 0
    reused = 0
    for trial in range(5):
        x = torch.full((n,), 1.0, device="cuda")
        y = torch.empty(n, device="cuda")
        address = x.data_ptr()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            torch.cuda._sleep(200_000_000)  # ~0.1 s of spinning before the read
            torch.mul(x, 2, out=y)
        x.record_stream(side)
        y.record_stream(side)
        del x
        z = torch.full((n,), 7.0, device="cuda")  # the default stream, right away
        reused += z.data_ptr() == address
        torch.cuda.synchronize()
        wrong = int((y != 2).sum().item())
        if wrong:
            failures += 1
            print("trial %d: %d of %d values read on the side stream are wrong (%s)"
                  % (trial, wrong, n, y[:1].item()))
        del y, z
    print("RESULT record reused=%d/5 wrong_trials=%d" % (reused, failures))
    if failures:
        return 1
    return 0 if reused else 3


def train(torch):
    nn = torch.nn
    model = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                          nn.Conv2d(32, 64, 3, padding=1, stride=2), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    g = torch.Generator(device="cuda").manual_seed(1)
    loss = None
    for step in range(40):
        b, r = 16 + (step * 7) % 48, 32 + (step * 13) % 64
        x = torch.randn(b, 3, r, r, device="cuda", generator=g)
        y = torch.randint(0, 10, (b,), device="cuda", generator=g)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    print("RESULT train final_loss=%.6f" % loss.item())
    return 0


if __name__ == "__main__":
    sys.exit(main())
