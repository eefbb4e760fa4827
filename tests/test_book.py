"""The root-cause book and question list: every packaged file loads and cross-references resolve."""

from __future__ import annotations

import re
from importlib.resources import files

import pytest

from stallhound import book
from stallhound.analysis import comm_context, program
from stallhound.model.errors import StallhoundError
from stallhound.tools import JOB_TOOL_NAMES, TOOL_NAMES

SEEDED = (
    "gpu-bubbles", "cpu-bottleneck", "nccl-serialization", "excessive-h2d-transfers", "small-kernel-overhead",
    "kernel-hotspot", "gc-pauses", "compute-communication-imbalance", "module-loading-hot-path",
    "excessive-synchronization",
)
ENTRIES = list(book.load_book().values())
QUESTIONS = book.load_questions()
QUESTION_IDS = {q.id for q in QUESTIONS}


def _by_id(items):
    return pytest.mark.parametrize("item", items, ids=[i.id for i in items])


@_by_id(ENTRIES)
def test_book_entry_fields_are_all_non_empty(item):
    for name, value in item:
        assert value or name == "verify_when", f"{item.id}: {name} is empty"  # verify_when: optional
    assert all(text.strip() for text in item.verify_when.values())
    for signal in item.signals:
        assert signal.tool and signal.figure and signal.threshold
    assert all(fix.text.strip() for fix in item.fixes)


@_by_id(ENTRIES)
def test_book_entry_id_equals_file_stem(item):
    assert (files("stallhound.book") / "entries" / f"{item.id}.md").is_file()


def test_book_ids_are_unique_and_cover_the_seeded_entries():
    stems = [p.name.removesuffix(".md") for p in (files("stallhound.book") / "entries").iterdir()
             if p.name.endswith(".md")]
    assert len(stems) == len(set(stems)) == len(ENTRIES)
    assert len(ENTRIES) >= 21
    assert set(SEEDED) <= {e.id for e in ENTRIES}


@_by_id(ENTRIES)
def test_book_signal_tools_are_real_tools(item):
    unknown = [s.tool for s in item.signals if s.tool not in TOOL_NAMES + JOB_TOOL_NAMES]
    assert not unknown, f"{item.id}: unknown tools {unknown}"


@_by_id(ENTRIES)
def test_book_related_questions_resolve(item):
    missing = [q for q in item.related_questions if q not in QUESTION_IDS]
    assert not missing, f"{item.id}: unknown question ids {missing}"


@_by_id(ENTRIES)
def test_book_render_entry_contains_fixes_and_signals(item):
    text = book.render_entry(item)
    assert text.startswith(f"# {item.title}")
    assert book.entry_uri(item.id) in text
    for fix in item.fixes:
        assert fix.text in text
    for signal in item.signals:
        assert f"`{signal.tool}`" in text


def test_book_render_entry_escapes_pipes_in_the_signals_table():
    entry = book.get_entry("unfused-attention")
    rows = [line for line in book.render_entry(entry).splitlines() if line.startswith("| `")]
    assert rows and all(line.replace("\\|", "").count("|") == 4 for line in rows)


def test_book_render_index_has_one_line_per_entry():
    lines = [line for line in book.render_index().splitlines() if line.startswith("- ")]
    assert len(lines) == len(ENTRIES)
    for entry, line in zip(ENTRIES, lines, strict=True):
        assert book.entry_uri(entry.id) in line and entry.title in line


def test_book_get_entry_returns_the_entry():
    assert book.get_entry("gpu-bubbles").id == "gpu-bubbles"
    assert book.entry_uri("gpu-bubbles") == "stallhound://book/gpu-bubbles"


def test_book_get_entry_unknown_id_names_valid_ids():
    with pytest.raises(book.UnknownEntry) as err:
        book.get_entry("no-such-cause")
    assert isinstance(err.value, StallhoundError)
    assert "no-such-cause" in str(err.value)
    for entry_id in SEEDED:
        assert entry_id in str(err.value)


def test_book_load_book_is_cached_but_returns_a_fresh_dict():
    first = book.load_book()
    first.clear()
    assert len(book.load_book()) == len(ENTRIES)


def test_book_malformed_entry_raises_book_error():
    with pytest.raises(book.BookError, match="front matter"):
        book._parse_entry("broken.md", "no front matter here")
    with pytest.raises(book.BookError, match="id must equal"):
        text = (files("stallhound.book") / "entries" / "gpu-bubbles.md").read_text(encoding="utf-8")
        book._parse_entry("renamed.md", text)


def test_book_question_ids_are_unique():
    assert len(QUESTION_IDS) == len(QUESTIONS)


def test_book_questions_cover_every_phase():
    assert {q.phase for q in QUESTIONS} == set(book.PHASES)
    for phase in book.PHASES:
        assert book.questions_for_phase(phase)


def test_book_question_numbers_are_one_to_thirty_eight():
    numbers = [q.number for q in QUESTIONS if q.number is not None]
    assert sorted(numbers) == list(range(1, 39))


@_by_id(QUESTIONS)
def test_book_question_is_answered_or_explained(item):
    assert all(tool in TOOL_NAMES for tool in item.answered_by), item.answered_by
    if not item.answered_by:
        assert item.cannot_because and item.ask_or_capture
    if item.cannot_because:
        assert item.ask_or_capture


def test_book_questions_for_unknown_phase_names_valid_phases():
    with pytest.raises(book.UnknownPhase) as err:
        book.questions_for_phase("tuning")
    assert isinstance(err.value, StallhoundError)
    assert all(phase in str(err.value) for phase in book.PHASES)


# --- fixes per program family ---------------------------------------------------------------------------------
# Fix families tried per program kind, most specific first, as triage tries them (analysis/program.py FIX_CHAINS).
CHAINS = {
    "pytorch": ("pytorch", "python", "generic"),
    "jax": ("python", "generic"),
    "cupy": ("python", "generic"),
    "numba": ("python", "generic"),
    "cudf": ("python", "generic"),
    "python": ("python", "generic"),
    "tensorrt": ("generic",),
    "julia": ("julia", "generic"),
    "stdpar": ("stdpar", "cuda", "generic"),
    "offload": ("offload", "generic"),
    "cuda": ("cuda", "generic"),
    "unknown": ("generic",),
}
# The `when` tags the detectors put on their findings, per root cause; a fix for any other tag is never shown.
DETECTOR_TAGS = {
    "kernel-hotspot": {"gemm-fp32", "gemm-tensor", "attention", "conv", "elementwise", "reduction", "norm", "copy",
                       "custom", "runtime", "launch-shape",
                       # hotspots.fit_tags: a GEMM no library claims; element-wise kernels of a program that
                       # trains; a kind on AMD
                       "gemm-own", "elementwise-training", "gemm-tensor-amd", "gemm-cutlass"},
    "fp32-gemm-no-tensor-cores": {"gemm-fp32", "fp16-tensor-cores"},  # top_kernels: 8.0+ (TF32) or 7.x (FP16)
    "excessive-h2d-transfers": {"pinned", "pageable", "many-small"},
    "pageable-host-memory": {"async-blocking", "large-single"},
    "module-loading-hot-path": {"jit", "module-load"},
    "cpu-bottleneck": {"launch", "host-cpu", "host-ops", "host-python", "input-pipeline"},
    "small-kernel-overhead": {"same-steps"},  # idle_causes: every step runs the same kernels, paced by launches
    "blocking-d2h-sync": {"held"},  # idle_causes: most of the reads' idle waited on work held by an untraced wait
    "gpu-bubbles": {"queued"},  # idle_bubbles: most of the bubble came with the next work already queued
    "profiler-window-on-warmup": {"one-shot"},  # idle_causes: one-time setup in a program that repeats nothing
    # sync-copy: the idle attribution's waits that are synchronous copies rather than synchronize calls
    "excessive-synchronization": {"device-sync", "stream-sync", "event-sync", "sync-copy"},
    "unified-memory-migration": {"memset", "host-touch", "both-ways", "prefetching"},
    # nccl_breakdown: the variant of the device's communication (analysis/comm_context.py)
    **{root: set(comm_context.VARIANTS) for root in ("nccl-serialization", "nccl-on-compute-stream",
                                                     "compute-communication-imbalance")},
}
PYTORCH_WORDS = re.compile(r"torch|DataLoader|\.item\(\)|(?<![\w.])nn\.|autocast|FSDP|\bDDP\b|DistributedDataParallel|"
                           r"TrainingArguments|Hugging Face|pin_memory=|non_blocking|num_workers|Inductor|Dynamo|"
                           r"DeepSpeed|Megatron", re.I)
PYTHON_WORDS = re.compile(r"\bgc\.|\bimport |\bPython\b|CuPy|Numba|\bJAX\b|\bjax\.|\bcupyx?\.|\bnumba\.|py-spy", re.I)
OTHER_PYTHON_FRAMEWORKS = re.compile(r"CuPy|Numba|\bJAX\b|\bjax\.|\bcupyx?\.|\bnumba\.", re.I)
# Calls, directives and flags of one family: generic fixes must hold in every program, so they name none.
FAMILY_API = re.compile(r"\bcuda[A-Z]\w*|\bcu[A-Z][a-z]\w*|\bcublas\w*|\bcudnn[A-Z]\w*|\bnccl[A-Z]\w*|\bnvrtc\w*|"
                        r"\bnvcc\b|#pragma|\$acc|-gpu=|-Minfo|<<<")
CUDA_VOCABULARY = re.compile(r"\bcuda[A-Z]\w*|\bcu[A-Z][a-z]\w*|\bcublas|\bcuBLAS|\bCUDA_[A-Z_]+|\bcuDNN|\bcudnn|"
                             r"\bnccl[A-Z]|\bNVRTC|\bnvcc\b|\bncu\b|CUDA graph|\bCUB\b|cub::|NVTX|__\w+|<cuda|\bMPI_|"
                             r"\bhip[A-Z][A-Za-z]+")  # HIP: the same family's C++ on AMD
STDPAR_VOCABULARY = re.compile(r"std::|par_unseq|-stdpar|nvc\+\+|parallel.algorithm")
JULIA_VOCABULARY = re.compile(r"CUDA\.|CuArray|@cuda|@\.|\bJulia\b|\bjulia\b|NVTX\.|MPI\.")
OFFLOAD_VOCABULARY = re.compile(r"OpenACC|OpenMP|#pragma (acc|omp)|\basync\b|\bnowait\b|\b(target )?data\b|\bpresent\b|"
                                r"-gpu=|-Minfo|\bcollapse\b|\bupdate\b|\bacc_\w+")
# Entries for every program that rely on the generic fix for a native family, and why that is enough.
NO_OWN_FIX = {
    ("nccl-straggler", "cuda"): "what makes one rank late shows in its own profile; the generic steps say where",
    ("nccl-straggler", "offload"): "what makes one rank late shows in its own profile; the generic steps say where",
    ("nccl-straggler", "stdpar"): "what makes one rank late shows in its own profile; the generic steps say where",
    ("nccl-straggler", "julia"): "what makes one rank late shows in its own profile; the generic steps say where",
    ("compute-communication-imbalance", "stdpar"): "balancing a partition does not depend on how kernels are written",
    ("compute-communication-imbalance", "julia"): "balancing a partition does not depend on how kernels are written",
    ("nccl-serialization", "stdpar"): "NCCL calls in stdpar code are CUDA code on a stream: the CUDA fix holds",
    ("nccl-on-compute-stream", "stdpar"): "NCCL calls in stdpar code are CUDA code on a stream: the CUDA fix holds",
    ("nccl-serialization", "julia"): "CUDA.jl programs reach NCCL through its own bindings; the generic fix holds",
    ("nccl-on-compute-stream", "julia"): "CUDA.jl programs reach NCCL through its own bindings; the generic fix holds",
    ("fp32-gemm-no-tensor-cores", "stdpar"): "GEMM kernels in stdpar code are cuBLAS calls: the CUDA fix holds",
    ("unfused-attention", "stdpar"): "parallel algorithms do not implement attention; the CUDA fused-kernel fix holds",
    ("unfused-attention", "julia"): "attention in CUDA.jl comes from a library; the generic fused-kernel fix holds",
    ("compute-communication-imbalance", "offload"): "balancing a partition does not depend on how kernels are written",
    ("nccl-serialization", "offload"): "directive codes reach NCCL through a queue's stream: nccl-on-compute-stream",
    ("unfused-attention", "offload"): "directive codes do not implement attention; the generic fused-kernel fix holds",
    **{("profiler-overhead", family): "the profiler's own work: nothing to change in any program"
       for family in ("pytorch", "cuda", "offload", "stdpar", "julia")},
}
FAMILY_FIXES = [(e, f) for e in ENTRIES for f in e.fixes]


def _by_fix(family_filter):
    chosen = [(e, f) for e, f in FAMILY_FIXES if family_filter(f.family)]
    return pytest.mark.parametrize("entry, fix", chosen, ids=[f"{e.id}:{f.family}:{f.when or ''}:{i}"
                                                              for i, (e, f) in enumerate(chosen)])


# The trace facts triage fits every fix to (analysis/fix_context.py): an AMD GPU, a torch.profiler trace.
CONTEXT_TAGS = {"amd", "kineto"}


def _tags_of(entry) -> list[str]:
    """The finding tags the entry's fixes name (a `when` of several, joined by '+', names each), context left out."""
    return sorted({part for f in entry.fixes if f.when for part in f.when.split("+")} - CONTEXT_TAGS)


def _shown(entry, context=()):
    """Every (program kind, tags) case and the fix triage would show for it in a trace of `context`."""
    cases = [()] + [(tag,) for tag in _tags_of(entry)]
    return [(kind, tags, entry.fix_for(chain, tags, context)) for kind, chain in CHAINS.items()
            if entry.applies(chain) for tags in cases]


@_by_fix(lambda family: family != "pytorch")
def test_book_fix_outside_pytorch_uses_no_pytorch_vocabulary(entry, fix):
    assert not PYTORCH_WORDS.search(fix.text), fix.text


@_by_fix(lambda family: family in ("cuda", "offload", "stdpar", "julia", "generic"))
def test_book_fix_outside_python_uses_no_python_vocabulary(entry, fix):
    assert not PYTHON_WORDS.search(fix.text), fix.text


@_by_fix(lambda family: family == "generic")
def test_book_generic_fix_names_no_family_specific_call_or_flag(entry, fix):
    assert not FAMILY_API.search(fix.text), fix.text


@_by_fix(lambda family: family == "cuda")
def test_book_cuda_fix_speaks_cuda(entry, fix):
    assert CUDA_VOCABULARY.search(fix.text), fix.text


@_by_fix(lambda family: family == "offload")
def test_book_offload_fix_speaks_directives(entry, fix):
    assert OFFLOAD_VOCABULARY.search(fix.text), fix.text


@_by_fix(lambda family: family == "stdpar")
def test_book_stdpar_fix_speaks_parallel_algorithms(entry, fix):
    assert STDPAR_VOCABULARY.search(fix.text), fix.text


@_by_fix(lambda family: family == "julia")
def test_book_julia_fix_speaks_cuda_jl(entry, fix):
    assert JULIA_VOCABULARY.search(fix.text), fix.text


EXPLICIT_CUDA_DATA = re.compile(r"cudaMallocHost|cudaMemcpyAsync|cudaStream|cudaGraph|cudaMallocAsync")


@_by_id(ENTRIES)
def test_book_stdpar_programs_are_never_told_to_manage_data_explicitly(item):
    """Under -stdpar the heap is managed memory that the runtime moves: a fix that allocates pinned buffers,
    copies on streams or builds CUDA graphs asks for code the program does not have. The CUDA fixes it falls back
    to (NCCL entries) are exempt: NCCL calls are stream code in any program."""
    for kind, tags, fix in _shown(item):
        if kind == "stdpar" and (item.id, "stdpar") not in NO_OWN_FIX:
            assert not EXPLICIT_CUDA_DATA.search(fix.text), (tags, fix.family, fix.text)


@_by_id(ENTRIES)
def test_book_when_tags_are_ones_the_detectors_emit(item):
    used = set(_tags_of(item))
    assert used <= DETECTOR_TAGS.get(item.id, set()), used - DETECTOR_TAGS.get(item.id, set())


@_by_id(ENTRIES)
def test_book_every_program_is_shown_a_fix_of_its_own_chain_in_its_own_words(item):
    for kind, tags, fix in _shown(item):
        assert fix.family in CHAINS[kind], (kind, tags, fix.family)
        if kind != "pytorch":
            assert not PYTORCH_WORDS.search(fix.text), (kind, tags, fix.text)
        if "python" not in CHAINS[kind]:
            assert not PYTHON_WORDS.search(fix.text), (kind, tags, fix.text)


@_by_id(ENTRIES)
def test_book_pytorch_programs_are_not_shown_another_python_framework(item):
    for kind, tags, fix in _shown(item):
        if kind == "pytorch":
            assert not OTHER_PYTHON_FRAMEWORKS.search(fix.text), (tags, fix.text)


@_by_id(ENTRIES)
def test_book_tagged_fix_is_never_hidden_by_a_plain_fix_of_a_nearer_family(item):
    for kind, (tag,), fix in ((k, t, f) for k, t, f in _shown(item) if t):
        tagged = any(f.when == tag and f.family in CHAINS[kind] for f in item.fixes)
        assert fix.when == (tag if tagged else None), (kind, tag, fix.family, fix.text)


@_by_id([e for e in ENTRIES if "generic" not in e.applies_to])
def test_book_entry_for_some_families_has_no_generic_fix(item):
    # a generic fix would be shown to a program where the cause cannot occur
    assert all(f.family in item.applies_to or f.family == "pytorch" and "python" in item.applies_to
               for f in item.fixes), [f.family for f in item.fixes]


@_by_id([e for e in ENTRIES if "generic" in e.applies_to])
def test_book_entry_for_every_program_has_native_fixes_or_says_why_not(item):
    families = {f.family for f in item.fixes}
    for family in ("pytorch", "cuda", "offload", "stdpar", "julia"):
        assert (family in families) != ((item.id, family) in NO_OWN_FIX), (item.id, family)


@_by_id([e for e in ENTRIES if "generic" in e.applies_to])
def test_book_title_and_symptom_of_an_entry_for_every_program_are_framework_neutral(item):
    for text in (item.title, item.symptom):
        assert not PYTORCH_WORDS.search(text) and not PYTHON_WORDS.search(text), text


def test_book_chains_are_the_programs_chains():
    assert CHAINS == program.FIX_CHAINS


def test_book_stdpar_program_is_not_told_to_pin_buffers_or_stream_copies():
    """The CUDA fix (cudaMallocHost, cudaMemcpyAsync) is impossible advice for C++ parallel algorithms on managed
    memory; each tag of the entry gets the stdpar variant."""
    entry = book.get_entry("pageable-host-memory")
    for tags in ((), ("async-blocking",), ("large-single",)):
        fix = entry.fix_for(CHAINS["stdpar"], tags)
        assert fix.family == "stdpar" and "cudaMallocHost" not in fix.text and fix.when == (tags[0] if tags else None)
    assert "cudaMallocHost" in entry.fix_for(CHAINS["cuda"]).text


def test_book_alloc_in_loop_fits_each_family():
    entry = book.get_entry("alloc-in-loop")
    assert "cudaMallocAsync" in entry.fix_for(CHAINS["cuda"]).text
    assert "cudaMemPoolAttrReleaseThreshold" in entry.fix_for(CHAINS["cuda"]).text
    assert "empty_cache" in entry.fix_for(CHAINS["pytorch"]).text
    assert "enter data" in entry.fix_for(CHAINS["offload"]).text
    assert entry.fix_for(CHAINS["unknown"]).family == "generic"
    assert {s.tool for s in entry.signals} >= {"gpu_idle_gaps", "query_sql"}


ONE_ENTRY = """+++
id = "toy"
title = "t"
symptom = "s"
mechanism = "m"
signals = [{ tool = "gpu_idle_gaps", figure = "f", threshold = "t" }]
applies_to = [%s]
fixes = [%s]
verify = "v"
related_questions = ["q08-idle-gaps"]
sources = ["s"]
+++
body
"""
TOY_FIXES = """
  { for = "pytorch", text = "pytorch plain" },
  { for = "python", when = "jit", text = "python jit" },
  { for = "python", text = "python plain" },
  { for = "cuda", when = "jit", text = "cuda jit" },
  { for = "generic", when = "pinned", text = "generic pinned" },
  { for = "generic", text = "generic plain" },
  { for = "generic", text = "generic second" },
"""


def _toy(applies_to: str = '"generic"', fixes: str = TOY_FIXES) -> book.Entry:
    return book._parse_entry("toy.md", ONE_ENTRY % (applies_to, fixes))


@pytest.mark.parametrize("chain, tags, shown", [
    (CHAINS["pytorch"], (), "pytorch plain"),
    (CHAINS["pytorch"], ("jit",), "pytorch plain"),         # the nearest family wins over a farther tagged fix
    (CHAINS["python"], ("jit",), "python jit"),              # within a family the tagged fix comes first
    (CHAINS["python"], ("module-load",), "python plain"),    # an unknown tag falls back to the plain fix
    (CHAINS["cuda"], ("jit",), "cuda jit"),
    (CHAINS["cuda"], (), "generic plain"),                   # no plain cuda fix: on to generic, its first plain fix
    (CHAINS["cuda"], ("pinned",), "generic pinned"),
    (CHAINS["offload"], ("jit", "pinned"), "generic pinned"),
    (CHAINS["unknown"], (), "generic plain"),
])
def test_book_fix_for_picks_the_nearest_family_then_its_tagged_fix(chain, tags, shown):
    assert _toy().fix_for(chain, tags).text == shown


def test_book_fix_for_falls_back_to_a_family_the_cause_applies_to():
    entry = _toy('"python"', '{ for = "python", text = "python plain" }')
    assert not entry.applies(CHAINS["cuda"]) and entry.applies(CHAINS["pytorch"])
    assert entry.fix_for(CHAINS["cuda"]).text == "python plain"


def test_book_entry_without_a_plain_fix_for_a_family_it_applies_to_fails_to_load():
    with pytest.raises(book.BookError, match="no fix without `when` for cuda"):
        _toy('"python", "cuda"', '{ for = "python", text = "p" }, { for = "cuda", when = "jit", text = "c" }')


def test_book_fix_for_an_unknown_family_fails_to_load():
    with pytest.raises(book.BookError, match="malformed"):
        _toy(fixes='{ for = "fortran", text = "f" }')


# Entries whose detectors fire only on GPUs with bf16 tensor cores (compute capability 8.0+, top_kernels.TF32_MIN_ARCH)
BF16_ONLY_WHERE_IT_RUNS = {"fp32-gemm-no-tensor-cores"}


@_by_id([e for e in ENTRIES if e.id not in BF16_ONLY_WHERE_IT_RUNS])
def test_book_bf16_advice_says_what_gpus_without_bf16_use(item):
    """bf16 runs only on compute capability 8.0+: a fix that may be shown for a V100 or T4 (7.x) and tells PyTorch to
    autocast to bf16 also gives the fp16 path with its GradScaler."""
    for fix in item.fixes:
        if "torch.bfloat16" in fix.text:
            assert "float16" in fix.text.replace("bfloat16", "") and "GradScaler" in fix.text, fix.text


# --- fixes fitted to the trace: an AMD GPU, a torch.profiler trace (analysis/fix_context.py) ---------------------
@pytest.mark.parametrize("tags, context, shown", [
    (("jit",), (), "python jit"),
    (("jit",), ("amd",), "python jit amd"),           # both of a '+' when present: it beats the one-tag fix
    (("jit",), ("kineto",), "python jit"),            # a context tag the entry does not name changes nothing
    ((), ("amd",), "python amd"),                     # a context-only fix beats the plain one
    (("amd",), (), "python amd"),                     # a finding's own tag fits a when as well
    (("module-load",), ("amd",), "python amd"),       # an unknown finding tag: the context-only fix
])
def test_book_fix_for_fits_the_trace_context(tags, context, shown):
    entry = _toy('"python"', """{ for = "python", when = "jit", text = "python jit" },
        { for = "python", when = "jit+amd", text = "python jit amd" },
        { for = "python", when = "amd", text = "python amd" },
        { for = "python", text = "python plain" }""")
    assert entry.fix_for(CHAINS["python"], tags, context).text == shown


def test_book_fix_for_prefers_the_findings_tag_over_the_context():
    """A fix naming the finding's own tag beats one naming only the trace's context; a '+' fix needs every part."""
    entry = _toy(fixes="""{ for = "generic", when = "amd", text = "amd" },
        { for = "generic", when = "pinned", text = "pinned" },
        { for = "generic", when = "pinned+kineto", text = "pinned kineto" },
        { for = "generic", text = "plain" }""")
    assert entry.fix_for(CHAINS["unknown"], ("pinned",), ("amd",)).text == "pinned"
    assert entry.fix_for(CHAINS["unknown"], ("pinned",), ("amd", "kineto")).text == "pinned kineto"
    assert entry.fix_for(CHAINS["unknown"], (), ("kineto",)).text == "plain"


# What CUDA alone has: its environment variables, NVIDIA's tools (Nsight, ncu, nsys, nvidia-smi), libraries and
# hardware names. `torch.backends.cudnn` is PyTorch's switch, which on ROCm drives MIOpen: not the library's name.
CUDA_ONLY = re.compile(r"\bCUDA_[A-Z_]+|_CUDA_ALLOC_CONF|nvidia-smi|Nsight|\bncu\b|\bnsys\b|cudaProfiler|"
                       r"CUPY_TF32|\bTF32\b|NVIDIA|"
                       r"\bcuBLAS|cuDNN|CUDNN_|\bnvtx\b|NVTX|CUPTI|\bcudaMalloc|\bcudaHost|multiple of 32|"
                       r"\bsm_\d|Ampere|Hopper|\bA100\b|\bH100\b|\bV100\b|\bT4\b")
# Root causes whose detectors never fire on an AMD trace, and why.
NOT_ON_AMD = {
    "fp32-gemm-no-tensor-cores": "top_kernels reads no tensor cores from an AMD gfx version (basis 'amd')",
    "unified-memory-migration": "needs nsys' unified-memory fault records, which no torch.profiler trace holds",
}
# AMD traces are torch.profiler's (nsys traces NVIDIA GPUs only), whose format makes the program PyTorch
# (program_clues: FORMAT_WEIGHT), so its fixes come from the pytorch chain.
AMD_KINDS = ("pytorch",)


def _amd_cases(entry):
    """(kind, tags, fix) shown on an AMD torch.profiler trace; a kernel hotspot carries its kind's '-amd' tag too
    (hotspots.fit_tags)."""
    tags = [()] + [(t, f"{t}-amd") if entry.id == "kernel-hotspot" else (t,) for t in _tags_of(entry)
                   if not t.endswith("-amd")]
    return [(kind, t, entry.fix_for(CHAINS[kind], t, ("amd", "kineto"))) for kind in AMD_KINDS
            if entry.applies(CHAINS[kind]) for t in tags]


@_by_id([e for e in ENTRIES if e.id not in NOT_ON_AMD])
def test_book_amd_traces_are_shown_no_cuda_only_knob_or_tool(item):
    for kind, tags, fix in _amd_cases(item):
        assert not CUDA_ONLY.search(fix.text), (kind, tags, fix.when, fix.text)


@_by_id(ENTRIES)
def test_book_torch_profiler_traces_get_nsys_only_with_why(item):
    """A torch.profiler user is told torch.profiler's options; nsys only beside them, for what torch.profiler does
    not record (OS calls, CPU samples), and saying so."""
    for kind, tags, fix in _shown(item, ("kineto",)):
        if kind == "pytorch" and re.search(r"\bnsys\b", fix.text):
            assert re.search(r"torch\.profiler (does not record|records ops, not)", fix.text), (tags, fix.text)


@_by_id(ENTRIES)
def test_book_nsys_traces_of_pytorch_are_not_told_to_use_torch_profiler(item):
    for kind, tags, fix in _shown(item):
        if kind == "pytorch":
            assert not re.search(r"torch\.profiler|schedule\(|with_stack|prof\.step", fix.text), (tags, fix.text)


def test_book_module_loading_on_amd_names_hips_variable():
    """The readings of hta_rocm_mi250_minitoy: lazy code-object loading on ROCm is HIP's deferred loading."""
    entry = book.get_entry("module-loading-hot-path")
    for kind in AMD_KINDS:
        fix = entry.fix_for(CHAINS[kind], ("module-load",), ("amd", "kineto"))
        assert "HIP_ENABLE_DEFERRED_LOADING=0" in fix.text and "CUDA_MODULE_LOADING" not in fix.text
    assert "CUDA_MODULE_LOADING=EAGER" in entry.fix_for(CHAINS["pytorch"], ("module-load",), ("kineto",)).text


def test_verify_step_follows_the_findings_tag():
    """A one-shot program's setup (tag one-shot) has no steady state to re-capture: its verify step times whole runs;
    other findings of the entry keep the entry's."""
    entry = book.get_entry("profiler-window-on-warmup")
    assert entry.verify_for(["setup"]) == entry.verify and "first_vs_steady" in entry.verify
    one_shot = entry.verify_for(["setup", "one-shot"])
    assert one_shot != entry.verify and "first_vs_steady" not in one_shot and "whole runs" in one_shot
    assert f"- (one-shot): {one_shot}" in book.render_entry(entry)
