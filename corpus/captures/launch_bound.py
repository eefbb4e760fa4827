"""Inference of a deep, narrow MLP at batch 16: hundreds of tiny kernels per step; `--graph` replays a CUDA graph.

As first written: 24 Linear+ReLU layers of width 256, run 10 times a step, each layer two kernels of a few
microseconds, so the host's launches pace the GPU. With --graph: the same forward captured once in a CUDA graph
and replayed 10 times a step: the same kernels, one launch each replay.
"""

import torch

from _profiled import DEV, args, capture

opts = args("--graph")
torch.manual_seed(0)
layers = [m for _ in range(24) for m in (torch.nn.Linear(256, 256), torch.nn.ReLU())]
model = torch.nn.Sequential(*layers).to(DEV).eval()
inputs = torch.randn(16, 256, device=DEV)
REPEATS = 10

if opts.graph and DEV == "cuda":
    with torch.no_grad():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                model(inputs)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outputs = model(inputs)

    def forward() -> None:
        graph.replay()
else:
    def forward() -> None:
        model(inputs)


def step(i: int) -> None:
    with torch.no_grad():
        for _ in range(REPEATS):
            forward()


capture(step, opts.out, wait=1, warmup=1, active=3)
