"""A jitted JAX training loop, timed: the whole-program benchmark for JAX.

Each step calls a jitted MLP update from Python, so every step allocates its
outputs and XLA's temporary buffer. With XLA_PYTHON_CLIENT_ALLOCATOR=platform
those go straight to the CUDA driver (cuMemAlloc/cuMemFree); with the default
allocator JAX keeps its own pool. Prints:
  RESULT jax_loop steps=N final_loss=X wall_s=Y backend=gpu
Usage: python3 jax_loop.py [steps]
"""
import sys
import time

import jax
import jax.numpy as jnp


def init_params(key, sizes):
    params = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
        key, sub = jax.random.split(key)
        params.append((jax.random.normal(sub, (fan_in, fan_out)) * (2.0 / fan_in) ** 0.5,
                       jnp.zeros((fan_out,))))
    return params


def loss_fn(params, inputs, labels):
    hidden = inputs
    for weight, bias in params[:-1]:
        hidden = jax.nn.relu(hidden @ weight + bias)
    weight, bias = params[-1]
    logits = hidden @ weight + bias
    return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * labels, axis=-1))


@jax.jit
def update(params, inputs, labels):
    loss, grads = jax.value_and_grad(loss_fn)(params, inputs, labels)
    new_params = [(w - 1e-3 * gw, b - 1e-3 * gb) for (w, b), (gw, gb) in zip(params, grads)]
    return new_params, loss


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 500
    key = jax.random.PRNGKey(0)
    params = init_params(key, [512, 1024, 1024, 10])
    inputs = jax.random.normal(jax.random.PRNGKey(1), (16, 256, 512))
    labels = jax.nn.one_hot(jax.random.randint(jax.random.PRNGKey(2), (16, 256), 0, 10), 10)
    params, loss = update(params, inputs[0], labels[0])  # compile outside the timing
    loss.block_until_ready()
    start = time.perf_counter()
    for step in range(steps):
        batch = step % inputs.shape[0]
        params, loss = update(params, inputs[batch], labels[batch])
    final = float(loss.block_until_ready())
    wall = time.perf_counter() - start
    print(f"RESULT jax_loop steps={steps} final_loss={final:.8e} wall_s={wall:.3f} "
          f"backend={jax.default_backend()}", flush=True)


if __name__ == "__main__":
    main()
