"""torch.multiprocessing shares a CUDA tensor between processes: run
natively and under the shim, with PyTorch's caching
allocator on (it cudaMallocs big segments, exports a segment with
cudaIpcGetMemHandle and sends the tensor's offset in it). With the cache
off (PYTORCH_NO_CUDA_MEMORY_CACHING=1) PyTorch refuses to share CUDA
tensors natively too ("invalid device pointer" in _share_cuda_), so the GPU
suite runs the cache-on case only.

Steps:
  1. The parent makes a tensor that is a view at an offset inside a larger
     one (so the offset PyTorch sends matters), fills it with a known ramp.
  2. A spawned child (a fresh interpreter: LD_PRELOAD is inherited) gets it
     through a torch.multiprocessing queue, checks every value on the GPU,
     adds 1 in place, and answers.
  3. The parent checks that the child's additions are in its tensor, and
     does it again with a second tensor (a second export of other memory).
Prints `torch_ipc: PASS ...` and exits 0, or `torch_ipc: FAIL ...` and 1, and
`RESULT torch_ipc round_ms=A,B`: each round from the put to the child's answer
(the tensor's export, the child's open through the queue, its check).
"""
import os
import sys
import time

import torch
import torch.multiprocessing as mp

N = 3 * 1024 * 1024 + 17  # float32 values: ~12 MiB, several pieces of the pool


def child(inbox, outbox):
    try:
        for _ in range(2):
            tensor, start = inbox.get()
            expected = torch.arange(start, start + tensor.numel(), device=tensor.device, dtype=torch.float32)
            wrong = int((tensor != expected).sum().item())
            if wrong == 0:
                tensor.add_(1)
                torch.cuda.synchronize()
            outbox.put(wrong)
            del tensor
    except Exception as e:  # report, never hang the parent
        outbox.put("error: %r" % (e,))


def main():
    if not torch.cuda.is_available():
        print("torch_ipc: SKIP no CUDA")
        return 0
    caching = os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") != "1"
    torch.zeros(1, device="cuda")  # CUDA (and the shim) start here, with this process's settings
    os.environ["POOLSHIM_STATS"] = "0"  # the children inherit it: only this process's statistics are checked
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=child, args=(inbox, outbox))
    proc.start()
    ok = True
    keep = []
    round_ms = []
    for round_, start in enumerate((1000.0, 5.0e6)):
        backing = torch.zeros(N + 4096, device="cuda", dtype=torch.float32)
        tensor = backing[4096:]  # a view at an offset inside the allocation
        tensor.copy_(torch.arange(start, start + N, device="cuda", dtype=torch.float32))
        torch.cuda.synchronize()
        began = time.perf_counter()
        inbox.put((tensor, start))
        answer = outbox.get(timeout=120)
        round_ms.append((time.perf_counter() - began) * 1e3)
        if answer != 0:
            print("torch_ipc: FAIL round %d: the child saw %s wrong values" % (round_, answer))
            ok = False
            break
        expected = torch.arange(start + 1, start + 1 + N, device="cuda", dtype=torch.float32)
        wrong = int((tensor != expected).sum().item())
        if wrong:
            print("torch_ipc: FAIL round %d: %d values lack the child's +1" % (round_, wrong))
            ok = False
            break
        keep.append(backing)
    proc.join(timeout=60)
    if proc.exitcode not in (0, None) and ok:
        print("torch_ipc: FAIL the child exited %s" % proc.exitcode)
        ok = False
    print("RESULT torch_ipc round_ms=%s" % ",".join("%.1f" % ms for ms in round_ms))
    if ok:
        print("torch_ipc: PASS a CUDA tensor shared both ways, 2 rounds (caching allocator %s, shim %s)"
              % ("on" if caching else "off", "preloaded" if "poolshim" in os.environ.get("LD_PRELOAD", "") else "off"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
