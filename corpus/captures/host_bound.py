"""Per-step preprocessing in Python: token ids built in a list and turned into a tensor on the host each step.

The host spends tens of milliseconds a step in plain Python (no torch op) before the short GPU work, so the
device idles between steps on host work that is not a copy, a sync or a launch.
"""

import random

import torch
import torch.nn.functional as F

from _profiled import DEV, args, capture

opts = args()
torch.manual_seed(0)
random.seed(0)
texts = [" ".join(random.choice("abcdefgh") * random.randint(1, 8) for _ in range(400)) for _ in range(64 * 6)]
vocab: dict[str, int] = {}
embed = torch.nn.EmbeddingBag(50000, 256).to(DEV)
head = torch.nn.Linear(256, 2).to(DEV)
optimizer = torch.optim.SGD([*embed.parameters(), *head.parameters()], lr=0.1)


def tokenize(text: str) -> list[int]:
    return [vocab.setdefault(word, len(vocab) % 50000) for word in text.split()]


def step(i: int) -> None:
    chunk = texts[64 * i: 64 * (i + 1)]
    ids = [tokenize(text) for text in chunk for _ in range(20)][:64]
    flat = torch.tensor([t for row in ids for t in row], device=DEV)
    offsets = torch.tensor([0] + [len(row) for row in ids[:-1]], device=DEV).cumsum(0)
    loss = F.cross_entropy(head(embed(flat, offsets)), torch.zeros(64, dtype=torch.long, device=DEV))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


capture(step, opts.out, wait=1, warmup=1, active=4)
