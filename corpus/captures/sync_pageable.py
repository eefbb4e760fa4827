"""An MLP trained on batches held in host memory; `--fixed` runs the same work the way the book advises.

As first written: each batch is copied from pageable memory, the loss is read back with `.item()` every step and
the host waits on the device after each step (torch.cuda.synchronize), so the GPU idles on the host.
With --fixed: the batches are pinned, copied with non_blocking=True, and the loss is summed on the device and read
once at the end. Both runs launch the same kernels on the same data: a pair for diff and verify_fix.
"""

import torch
import torch.nn.functional as F

from _profiled import DEV, args, capture

opts = args("--fixed")
torch.manual_seed(0)
STEPS, BATCH, WIDTH = 8, 512, 2048
model = torch.nn.Sequential(*[m for _ in range(4) for m in (torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU())],
                            torch.nn.Linear(WIDTH, 10)).to(DEV)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
batches = [torch.randn(BATCH, WIDTH) for _ in range(STEPS)]
labels = [torch.randint(0, 10, (BATCH,)) for _ in range(STEPS)]
if opts.fixed and DEV == "cuda":
    batches = [b.pin_memory() for b in batches]
    labels = [y.pin_memory() for y in labels]
losses = []
total = torch.zeros((), device=DEV)


def step(i: int) -> None:
    global total
    x = batches[i].to(DEV, non_blocking=opts.fixed)
    y = labels[i].to(DEV, non_blocking=opts.fixed)
    loss = F.cross_entropy(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    if opts.fixed:
        total += loss.detach()
    else:
        losses.append(loss.item())
        if DEV == "cuda":
            torch.cuda.synchronize()


capture(step, opts.out, wait=1, warmup=1, active=6, with_stack=True)
print("mean loss", total.item() / STEPS if opts.fixed else sum(losses) / len(losses))
