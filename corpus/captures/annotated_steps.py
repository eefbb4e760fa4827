"""A transformer encoder trained for 5 steps, each wrapped in record_function("train_step"), profiled from start.

No torch.profiler schedule: the trace has no ProfilerStep ranges, and it opens on the one-time setup (building
the model, the first step's kernel selection). The steps are the program's own `train_step` annotations.
"""

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile, record_function

from _profiled import DEV, args

opts = args()
torch.manual_seed(0)
activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEV == "cuda" else [])
with profile(activities=activities, record_shapes=True) as prof:
    with record_function("setup"):
        layer = torch.nn.TransformerEncoderLayer(d_model=512, nhead=8, dim_feedforward=2048, batch_first=True)
        model = torch.nn.TransformerEncoder(layer, num_layers=2).to(DEV)
        head = torch.nn.Linear(512, 1000).to(DEV)
        optimizer = torch.optim.AdamW([*model.parameters(), *head.parameters()], lr=1e-4)
        tokens = torch.randn(32, 256, 512, device=DEV)
        targets = torch.randint(0, 1000, (32 * 256,), device=DEV)
    for _ in range(5):
        with record_function("train_step"):
            logits = head(model(tokens)).reshape(-1, 1000)
            loss = F.cross_entropy(logits, targets)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    if DEV == "cuda":
        torch.cuda.synchronize()
prof.export_chrome_trace(opts.out)
