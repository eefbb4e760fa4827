"""ResNet-18 training on synthetic images, profiled with schedule(wait=1, warmup=1, active=1): one ProfilerStep.

The batch lives on the GPU and nothing syncs inside the step: the trace is one healthy, GPU-bound training step,
the common capture a user takes with `active=1`.
"""

import torch
import torch.nn.functional as F
import torchvision

from _profiled import DEV, args, capture

opts = args()
torch.manual_seed(0)
model = torchvision.models.resnet18(num_classes=10).to(DEV)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
images = torch.randn(128, 3, 112, 112, device=DEV)
labels = torch.randint(0, 10, (128,), device=DEV)


def step(i: int) -> None:
    loss = F.cross_entropy(model(images), labels)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


capture(step, opts.out, wait=1, warmup=1, active=1)
