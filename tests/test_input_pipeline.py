"""input_pipeline: a data loader is seen from its own ranges or its worker threads, never from a word in a range."""

from __future__ import annotations

import pytest
from modeldb import make_model

from stallhound.analysis import input_pipeline


def ranges(*texts: str) -> list[dict]:
    return [{"pid": 1, "tid": 1, "text": t, "start_ns": i, "end_ns": i + 1, "kind": "push_pop", "depth": 0}
            for i, t in enumerate(texts)]


@pytest.mark.parametrize("texts, expected", [
    (("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",),
     ("NVTX range 'enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__'",)),
    (("## data_load ##", "get_batch"), ("NVTX range '## data_load ##'", "NVTX range 'get_batch'")),
    (("_next_data", "collate"), ("NVTX range '_next_data'", "NVTX range 'collate'")),
    # words that name no loader: DDP's forward, cuDF's getters, TorchRec's input all-to-all, weights prefetch
    (("DistributedDataParallel.forward", "DATAFRAME_COLUMNS_GETTER", "sparse_data_dist", "prefetch_weights",
      "aten::_softmax_backward_data", "metadata_load"), ()),
])
def test_input_pipeline_from_the_loaders_own_ranges(texts, expected):
    assert input_pipeline.evidence(make_model(nvtx=ranges(*texts))) == expected


@pytest.mark.parametrize("names, expected", [
    (("pt_main_thread", "pt_data_worker", "pt_data_worker", "pt_data_pin"),
     ("2 thread(s) pt_data_worker", "1 thread(s) pt_data_pin")),
    (("pt_main_thread", "pt_autograd_0", "python3.8"), ()),
])
def test_input_pipeline_from_loader_worker_threads(names, expected):
    threads = [{"pid": 1 + i, "tid": 10 + i, "name": n} for i, n in enumerate(names)]
    assert input_pipeline.evidence(make_model(threads=threads)) == expected
