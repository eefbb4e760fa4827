"""A step that empties PyTorch's cache after each of its 16 blocks: every block allocates device memory afresh.

`torch.cuda.empty_cache()` hands the cached blocks back to the driver, so the next block of a new size calls
cudaMalloc again and the emptying calls cudaFree: allocation inside the loop, with the device idle meanwhile.
"""

import torch

from _profiled import DEV, args, capture

opts = args()
torch.manual_seed(0)
weights = torch.randn(2048, 2048, device=DEV)


def step(i: int) -> None:
    for block in range(16):
        rows = 4096 + 512 * ((i * 16 + block) % 7)
        activations = torch.randn(rows, 2048, device=DEV)
        result = torch.relu(activations @ weights).sum()
        del activations
        if DEV == "cuda":
            torch.cuda.empty_cache()
        result.add_(1)


capture(step, opts.out, wait=1, warmup=1, active=3)
