"""A chain of 4096x4096 matrix products in fp32 with TF32 off; `--bf16` runs the same products in bfloat16.

As first written, fp32 with torch.backends.cuda.matmul.allow_tf32 = False: the products run on the CUDA cores.
With --bf16: the same shapes in bfloat16, on the tensor cores. The device is busy throughout either way.
"""

import torch

from _profiled import DEV, args, capture

opts = args("--bf16")
torch.manual_seed(0)
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
dtype = torch.bfloat16 if opts.bf16 else torch.float32
a = torch.randn(4096, 4096, device=DEV, dtype=dtype)
b = torch.randn(4096, 4096, device=DEV, dtype=dtype) / 64


def step(i: int) -> None:
    x = a
    for _ in range(12):
        x = torch.tanh(x @ b)


capture(step, opts.out, wait=1, warmup=1, active=3)
