"""Python frames as timed host work (formats.kineto.stacks: python_frames; analysis.python_work): a gap the host
spent in Python code that launched no GPU work is that code's, named by the deepest frame covering most of it. Tiny
Kineto traces at the rule's edges, and a real trace (TraceLens' TimeSformer pipeline) read against its JSON."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

from test_idle_evidence import corpus_profile

from stallhound.formats import open_profile
from stallhound.tools import triage

MS = 1000.0  # Kineto's microseconds in a millisecond
PID = TID = 7


def _py(pid_: int, parent: int | None, name: str, start_ms: float, end_ms: float) -> dict:
    return {"ph": "X", "cat": "python_function", "name": name, "pid": PID, "tid": TID, "ts": start_ms * MS,
            "dur": (end_ms - start_ms) * MS, "args": {"Python id": pid_, "Python parent id": parent}}


def _launch(corr: int, at_ms: float) -> list[dict]:
    """A cudaLaunchKernel of 10 us at at_ms and its 1 ms kernel 20 us after it."""
    return [{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": PID, "tid": TID, "ts": at_ms * MS,
             "dur": 10.0, "args": {"correlation": corr}},
            {"ph": "X", "cat": "kernel", "name": f"k{corr}", "pid": 0, "tid": 7, "ts": at_ms * MS + 20,
             "dur": MS, "args": {"correlation": corr, "device": 0, "stream": 7, "grid": [1, 1, 1],
                                 "block": [128, 1, 1]}}]


# The program's outer frames hold every launch (they cover the gap and everything else); preprocess launches nothing.
OUTER = [_py(1, None, "threading.py(1032): _bootstrap", 0, 60), _py(2, 1, "<string>(1): <module>", 0.5, 59.5),
         _py(3, 2, "pipelines/base.py(1306): __call__", 1, 59)]


def _trace(tmp_path: Path, frames: list[dict]) -> Path:
    """Six 1 ms kernels back to back from 0 ms and six from 46 ms (each launched 20 us before it starts): between
    them a 40 ms gap the host spends in `frames`."""
    events = [*(e for i in range(6) for e in _launch(i, i)), *(e for i in range(6) for e in _launch(6 + i, 46 + i)),
              *frames,
              {"ph": "M", "name": "thread_name", "pid": PID, "tid": TID, "args": {"name": "thread 7 (python)"}}]
    path = tmp_path / f"t{len(frames)}.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    return path


def _top(tmp_path: Path, cache: Path, frames: list[dict]):
    profile = open_profile(_trace(tmp_path, frames), cache_dir=cache)
    try:
        result = triage.run(profile.con, triage.Params(profile="t"))
        kept = profile.con.execute("SELECT function, depth FROM python_frames ORDER BY depth, start_ns").fetchall()
    finally:
        profile.close()
    return result.findings[0], kept


def test_the_deepest_frame_covering_most_of_the_gap_names_it_outer_frames_lose(tmp_path, cache_root):
    """preprocess (6.5-45.5 ms) holds the gap; inside it resize covers 30 of the 40 ms (deepest over half: it is
    named, with its own 30 ms), normalize 5 ms (under half: not); the outer frames hold launches and are not kept."""
    frames = [*OUTER, _py(4, 3, "pipelines/video.py(129): preprocess", 6.5, 45.5),
              _py(5, 4, "image_processing.py(235): resize", 8, 38), _py(6, 4, "image_processing.py(80): normalize",
                                                                         39, 44)]
    top, kept = _top(tmp_path, cache_root, frames)
    assert kept == [("preprocess", 3), ("resize", 4), ("normalize", 4)]
    assert top.root_cause == "cpu-bottleneck" and "host-python" in top.tags
    assert "in Python code that launched no GPU work 40.000 ms" in top.title  # the gap 3-43 ms, less 0.01 ms launch
    assert "the most in resize at image_processing.py:235, 30.000 ms" in top.title


def test_a_parent_is_named_where_no_child_covers_most(tmp_path, cache_root):
    """Children of 15 ms each (under half of the 40 ms gap): their parent preprocess is the deepest over half."""
    frames = [*OUTER, _py(4, 3, "pipelines/video.py(129): preprocess", 6.5, 45.5),
              _py(5, 4, "image_processing.py(235): resize", 8, 23), _py(6, 4, "image_processing.py(80): normalize",
                                                                         24, 39)]
    top, _ = _top(tmp_path, cache_root, frames)
    assert "the most in preprocess at pipelines/video.py:129, 39.000 ms" in top.title


def test_no_frames_leave_the_gap_unexplained(tmp_path, cache_root):
    """Without python_function events (or with only frames that hold launches) the gap stays gpu-bubbles."""
    for frames in ([], OUTER):
        top, kept = _top(tmp_path, cache_root, frames)
        assert kept == [] and top.root_cause == "gpu-bubbles"


def _raw_frames(path: Path) -> tuple[float, float, dict[str, float]]:
    """From the JSON: the step's start and the first GPU record (us), and each python_function's duration (us) by
    name, the frames on the launching thread between them."""
    events = json.load(gzip.open(path))["traceEvents"]
    step = next(e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep"))
    first_gpu = min(e["ts"] for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    frames = {e["name"]: e["dur"] for e in events if e.get("cat") == "python_function"
              and e["ts"] >= step["ts"] and e["ts"] + e["dur"] <= first_gpu}
    return step["ts"], first_gpu, frames


def test_timesformer_preprocessing_is_the_host_cause(cache_root):
    """TraceLens' TimeSformer pipeline: the 218.1 ms before the first GPU work is the pipeline's preprocess (JSON:
    217.474 ms), most of it VideoMAEImageProcessor.preprocess (178.200 ms), python_function events only. Triage
    names that frame as the host's Python work (cpu-bottleneck), no longer an unexplained bubble."""
    path = corpus_profile("tl_timesformer_h100_hf_video",
                          "c2d1d7fea329b45adf2d065875c817e02cbc19ed6c7d19eef3fd5e3364112e87")
    step_us, first_gpu_us, frames = _raw_frames(path)
    inner = frames["transformers/models/videomae/image_processing_videomae.py(235): preprocess"]
    assert round(first_gpu_us - step_us) == 218120 and round(inner) == 178200
    profile = open_profile(path, cache_dir=cache_root)
    try:
        result = triage.run(profile.con, triage.Params(profile=path.stem))
    finally:
        profile.close()
    top = result.findings[0]
    assert top.root_cause == "cpu-bottleneck" and "host-python" in top.tags
    assert "gpu-bubbles" not in {f.root_cause for f in result.findings}
    assert (f"the most in preprocess at transformers/models/videomae/image_processing_videomae.py:235, "
            f"{inner / 1000:.3f} ms") in top.title
    assert 0.95 * (first_gpu_us - step_us) * 1000 <= top.time_at_stake_ns <= (first_gpu_us - step_us) * 1000
