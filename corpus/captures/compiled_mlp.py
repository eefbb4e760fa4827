"""An MLP already wrapped in torch.compile, compiled before profiling: 3 steady steps of compiled training.

The compile happens in two warm-up steps outside the trace; the profiled steps run Triton kernels the compiler
fused. Advice to 'try torch.compile' would be wrong here: the program already uses it.
"""

import torch
import torch.nn.functional as F

from _profiled import DEV, args, capture

opts = args()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.LayerNorm(4096),
                            torch.nn.Linear(4096, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 10)).to(DEV)
compiled = torch.compile(model)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
x = torch.randn(1024, 1024, device=DEV)
y = torch.randint(0, 10, (1024,), device=DEV)


def step(i: int) -> None:
    loss = F.cross_entropy(compiled(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


for _ in range(2):
    step(-1)
capture(step, opts.out, wait=1, warmup=1, active=3)
