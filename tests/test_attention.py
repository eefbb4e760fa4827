"""analysis/attention: unfused attention, a softmax between two GEMMs on its stream with no fused kernel beside it."""

from __future__ import annotations

import gzip
import json
import re
from collections import defaultdict

import pytest
from modeldb import make_model
from test_idle_evidence import corpus_profile

from stallhound.analysis import attention
from stallhound.analysis.common import Scope
from stallhound.analysis.contracts import run_skill
from stallhound.formats import open_profile
from stallhound.tools import top_kernels as tk
from stallhound.tools import triage

GEMM = "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_bf16_128x128_64x3_nn_align8>(T1::Params)"
SOFTMAX = "void (anonymous namespace)::softmax_warp_forward<c10::BFloat16, c10::BFloat16, float, 8, false, false>()"
LOG_SOFTMAX = ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
               "at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue>(T4 *, const T2 *, int)")
SCALE = "void at::native::vectorized_elementwise_kernel<4, at::native::AUnaryFunctor<c10::BFloat16>>(int, T2, T3)"
COPY = "void at::native::elementwise_kernel<128, 4, at::native::direct_copy_kernel_cuda>(int, T3)"
ARGMAX = "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::ArgMaxOps<float>>>(T3)"
FLASH = "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4>, true, false>(Flash_fwd_params)"


def k(name: str, s: int, e: int, stream: int = 7, device: int = 0) -> dict:
    short = name.removeprefix("void ").split("<")[0].split("::")[-1].split("(")[0]
    return {"device_id": device, "stream_id": stream, "start_ns": s, "end_ns": e, "short_name": short, "name": name}


def chain(names: list[str], start: int = 0, each: int = 10, stream: int = 7) -> list[dict]:
    return [k(n, start + i * each, start + (i + 1) * each, stream) for i, n in enumerate(names)]


def read(kernels: list[dict]) -> list[attention.DeviceAttention]:
    con = make_model(kernels=kernels)
    end = max(r["end_ns"] for r in kernels)
    return attention.read(con, Scope(profile="t", devices=[0], start_ns=0, end_ns=end, duration_ns=end,
                                     window_basis="capture"))


def test_a_softmax_between_two_gemms_is_unfused_attention():
    kernels = chain([GEMM, SOFTMAX, GEMM]) + [k("other", 30, 130)]
    [a] = read(kernels)
    assert (a.softmax_count, a.unfused_count, a.unfused_ns, a.kernel_time_ns, a.fused_count) == (1, 1, 30, 130, 0)
    [f] = attention.findings([a], 130)
    assert (f.root_cause, f.time_at_stake_ns, f.device, f.evidence["unfused_pct"]) == ("unfused-attention", 30, 0,
                                                                                       23.08)
    assert f.title.startswith("device 0: unfused attention, 1 softmax launch (softmax_warp_forward) between two GEMMs")


def test_scaling_masking_and_copies_between_count_up_to_max_between():
    near = chain([GEMM, SCALE, COPY, SCALE, SOFTMAX, COPY, GEMM])
    [a] = read(near)
    assert (a.unfused_count, a.unfused_ns) == (1, 70)  # the kernels between are part of the chain's time
    far = chain([GEMM] + [SCALE] * (attention.MAX_BETWEEN + 1) + [SOFTMAX, GEMM])
    assert read(far)[0].unfused_count == 0


def test_chains_sharing_a_gemm_count_it_once_and_other_streams_do_not_break_them():
    kernels = chain([GEMM, SOFTMAX, GEMM, SOFTMAX, GEMM]) + [k(ARGMAX, 15, 16, stream=8)]
    [a] = read(kernels)
    assert (a.softmax_count, a.unfused_count, a.unfused_ns) == (2, 2, 50)


@pytest.mark.parametrize("kernels", [
    chain([GEMM, SOFTMAX, ARGMAX, GEMM]),  # a classifier head: one GEMM, then the softmax's result read
    chain([GEMM, SOFTMAX]),  # the softmax ends the stream
    chain([SCALE, SOFTMAX, GEMM]),  # no GEMM before it
    chain([GEMM, LOG_SOFTMAX, GEMM]),  # log-softmax ends a loss, never attention
], ids=["classifier-head", "last", "no-gemm-before", "log-softmax"])
def test_softmax_not_between_two_gemms_is_not_attention(kernels):
    assert all(a.unfused_count == 0 for a in read(kernels))
    assert attention.findings(read(kernels), 100) == []


def test_a_fused_attention_kernel_on_the_device_silences_it():
    kernels = chain([GEMM, SOFTMAX, GEMM]) + [k(FLASH, 40, 50)]
    [a] = read(kernels)
    assert (a.unfused_count, a.fused_count) == (1, 1)
    assert attention.findings([a], 50) == []


def test_below_the_share_of_kernel_time_it_is_no_finding():
    kernels = chain([GEMM, SOFTMAX, GEMM], each=1) + [k("other", 10, 10 + 300)]  # 3 of 303 ns: 1%
    [a] = read(kernels)
    assert a.unfused_count == 1 and attention.findings([a], 310) == []


def test_top_kernels_reports_it_through_run_skill():
    result = run_skill(make_model(kernels=chain([GEMM, SOFTMAX, GEMM])), tk, tk.Params(profile="t"))
    [f] = [f for f in result.findings if f.root_cause == "unfused-attention"]
    assert f.time_at_stake_ns == 30


# --- golden --------------------------------------------------------------------------------------------------------

def _json_chains(path) -> tuple[int, int, float]:
    """An independent reading of a Kineto trace: per stream, each softmax whose nearest kernels either side, through
    at most 3 element-wise or copy kernels, have 'gemm' in their names; (softmaxes, chains, chain time in ms, each
    kernel once)."""
    with gzip.open(path) as f:
        evs = [e for e in json.load(f)["traceEvents"] if e.get("cat") == "kernel" and e.get("ph") == "X"]
    streams = defaultdict(list)
    for e in evs:
        streams[(e["args"]["device"], e["args"]["stream"])].append(e)
    softmaxes, chains, members = 0, 0, set()
    for key, run_ in streams.items():
        run_.sort(key=lambda e: e["ts"])
        for i, e in enumerate(run_):
            if "softmax" not in e["name"].lower():
                continue
            softmaxes += 1
            ends = []
            for step in (-1, 1):
                j = i + step
                while 0 <= j < len(run_) and abs(j - i) <= 4 and re.search("elementwise|copy", run_[j]["name"]):
                    j += step
                if 0 <= j < len(run_) and abs(j - i) <= 4 and "gemm" in run_[j]["name"].lower():
                    ends.append(j)
            if len(ends) == 2:
                chains += 1
                members |= {(key, x) for x in range(ends[0], ends[1] + 1)}
    return softmaxes, chains, sum(streams[key][x]["dur"] for key, x in members) / 1e3


def test_owlv2_attention_is_unfused(cache_root):
    """tl_owlv2_h100_hf_pipeline (HF OWLv2 in bf16 on an H100): JSON, 180 softmaxes, each between two cutlass bf16
    GEMMs on its stream (120 directly, 60 of the text encoder through two mask adds), 492.506 ms of the 551.452 ms of
    kernel time, and no flash/fmha/efficient_attention kernel: one finding with that time at stake."""
    path = corpus_profile("tl_owlv2_h100_hf_pipeline",
                          "959efc7b235d78c5a22ad94c689175a4f5a4c1592edd5e2df6dafdd9098d5a10")
    softmaxes, chains, chain_ms = _json_chains(path)
    assert (softmaxes, chains, round(chain_ms, 3)) == (180, 180, 492.506)
    profile = open_profile(path, cache_dir=cache_root)
    try:
        result = triage.run(profile.con, triage.Params(profile="owlv2"))
    finally:
        profile.close()
    [f] = [f for f in result.findings if f.root_cause == "unfused-attention"]
    assert (f.evidence["unfused_count"], f.evidence["softmax_count"], f.evidence["fused_attention_count"]) == (180,
                                                                                                                180, 0)
    assert f.time_at_stake_ns == f.evidence["unfused_ns"] and round(f.time_at_stake_ns / 1e6, 3) == round(chain_ms, 3)
    assert f.severity == "high" and 'attn_implementation="sdpa"' in f.fix  # the fix for a PyTorch program
