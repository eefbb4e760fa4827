"""A batch gathered sample by sample: 256 separate host-to-device copies of 12 KiB each step.

Each sample tensor is moved to the device on its own and stacked there, so a step makes 512 small pageable
copies (images and labels) where one copy of the stacked batch would do.
"""

import torch
import torch.nn.functional as F

from _profiled import DEV, args, capture

opts = args()
torch.manual_seed(0)
samples = [(torch.randn(3, 32, 32), torch.tensor(k % 10)) for k in range(256 * 6)]
model = torch.nn.Sequential(torch.nn.Conv2d(3, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                            torch.nn.Flatten(), torch.nn.Linear(64, 10)).to(DEV)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)


def step(i: int) -> None:
    chunk = samples[256 * i: 256 * (i + 1)]
    images = torch.stack([image.to(DEV) for image, _ in chunk])
    labels = torch.stack([label.to(DEV) for _, label in chunk])
    loss = F.cross_entropy(model(images), labels)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


capture(step, opts.out, wait=1, warmup=1, active=3)
