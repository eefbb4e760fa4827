"""A Numba CUDA kernel called on NumPy arrays in a loop: every call copies its three arrays to the device and back.

Passing host arrays to a @cuda.jit kernel makes Numba copy each one in before the launch and out after it,
synchronously; cuda.to_device once before the loop would keep them on the device.
"""

import numpy as np
from numba import cuda


@cuda.jit
def scale_add(x, y, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = 0.5 * x[i] + y[i]


rng = np.random.default_rng(0)
x = rng.random(1 << 22, dtype=np.float32)
y = rng.random(1 << 22, dtype=np.float32)
out = np.empty_like(x)
for iteration in range(60):
    scale_add[(x.size + 255) // 256, 256](x, y, out)
    x, out = out, x
print(float(x.mean()))
