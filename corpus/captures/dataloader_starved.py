"""A small CNN fed by a DataLoader whose samples cost CPU time; `--workers` loads them in 8 worker processes.

As first written (num_workers=0): every sample is decoded and augmented in the training process, so the GPU
waits on the loader each step. With --workers: the same samples in 8 workers with pinned memory, prefetched.
"""

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from _profiled import DEV, args, capture

opts = args("--workers")
torch.manual_seed(0)


class Augmented(Dataset):
    """Synthetic 96x96 images, each 'decoded' by a round trip through the FFT and blurred: about 1 ms of CPU."""

    def __len__(self) -> int:
        return 4096

    def __getitem__(self, index: int):
        rng = np.random.default_rng(index)
        image = rng.random((3, 96, 96), dtype=np.float32)
        for _ in range(2):
            image = np.fft.ifft2(np.fft.fft2(image)).real.astype(np.float32)
        image = (image + np.roll(image, 1, axis=1) + np.roll(image, 1, axis=2)) / 3
        return torch.from_numpy(image), index % 10


workers = 8 if opts.workers else 0
loader = DataLoader(Augmented(), batch_size=64, shuffle=False, num_workers=workers,
                    pin_memory=opts.workers and DEV == "cuda", persistent_workers=opts.workers,
                    prefetch_factor=4 if opts.workers else None)
batches = iter(loader)
model = torch.nn.Sequential(torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                            torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                            torch.nn.Flatten(), torch.nn.Linear(64, 10)).to(DEV)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)


def step(i: int) -> None:
    images, labels = next(batches)
    images = images.to(DEV, non_blocking=True)
    labels = labels.to(DEV, non_blocking=True)
    loss = F.cross_entropy(model(images), labels)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


capture(step, opts.out, wait=2, warmup=1, active=5)
