"""A JAX MLP trained with a jitted step for 40 steps; the loss is read back with float() every step to print it.

XLA compiles the step at its first call; after that each step is one executable, but float(loss) waits for the
device every step before the next batch is even made.
"""

import jax
import jax.numpy as jnp

key = jax.random.PRNGKey(0)
sizes = [1024, 4096, 4096, 10]
params = [(jax.random.normal(jax.random.fold_in(key, k), (m, n)) / jnp.sqrt(m), jnp.zeros(n))
          for k, (m, n) in enumerate(zip(sizes[:-1], sizes[1:]))]


def loss_fn(params, x, y):
    for w, b in params[:-1]:
        x = jax.nn.relu(x @ w + b)
    w, b = params[-1]
    logits = x @ w + b
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], axis=1))


@jax.jit
def train_step(params, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    return jax.tree_util.tree_map(lambda p, g: p - 1e-3 * g, params, grads), loss


for step in range(40):
    batch_key = jax.random.fold_in(key, 1000 + step)
    x = jax.random.normal(batch_key, (2048, 1024))
    y = jax.random.randint(batch_key, (2048,), 0, 10)
    params, loss = train_step(params, x, y)
    print(step, float(loss))
