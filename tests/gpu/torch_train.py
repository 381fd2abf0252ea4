"""A small deterministic MLP training loop on the GPU.

Prints one line: RESULT torch_train steps=N final_loss=X wall_s=Y device=NAME
Run it with PYTORCH_NO_CUDA_MEMORY_CACHING=1 natively and under the shim: every
tensor then goes through cudaMalloc/cudaFree, and the final losses must match.
Usage: python3 torch_train.py [steps]
"""
import os
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
import torch  # noqa: E402


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    torch.manual_seed(1234)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    device = torch.device("cuda")
    generator = torch.Generator(device=device).manual_seed(99)
    model = torch.nn.Sequential(
        torch.nn.Linear(512, 1024), torch.nn.ReLU(),
        torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
        torch.nn.Linear(1024, 10),
    ).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    inputs = torch.randn(64, 256, 512, device=device, generator=generator)
    labels = torch.randint(0, 10, (64, 256), device=device, generator=generator)
    torch.cuda.synchronize()
    start = time.perf_counter()
    loss = None
    for step in range(steps):
        batch = step % inputs.shape[0]
        optimizer.zero_grad(set_to_none=True)  # grads are freed and reallocated each step
        logits = model(inputs[batch])
        loss = torch.nn.functional.cross_entropy(logits, labels[batch])
        loss.backward()
        optimizer.step()
    final = loss.item()
    torch.cuda.synchronize()
    wall = time.perf_counter() - start
    print(f"RESULT torch_train steps={steps} final_loss={final:.10e} wall_s={wall:.3f} "
          f"device={torch.cuda.get_device_name().replace(' ', '_')}", flush=True)


if __name__ == "__main__":
    main()
