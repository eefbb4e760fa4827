"""What kind of kernel is this, and what should a person call it? Pure functions on kernel names.

kind_of(name, short_name) reads the naming conventions of the libraries that emit most GPU time
(cuBLAS/cuBLASLt, CUTLASS, cuDNN, FlashAttention, PyTorch ATen, Triton/Inductor, nvFuser, XLA, CuPy,
CUB, the communication libraries of formats/comm_kernels.py, the NVHPC runtime's helpers) from the demangled name
without its parameter list, and returns one of KINDS; the first rule that matches wins, in the order of KINDS.
GEMMs are split by precision: 'gemm-fp32' when the name marks FP32 FMA (SIMT) arithmetic, 'gemm-tensor'
when it marks tensor-core math or a 16/8-bit or TF32 type, 'gemm' when the name does not tell.

min_arch_of(name) is the lowest SM architecture (e.g. 80 for 8.0) a kernel name shows it was compiled
for (sm80_..., ampere_..., cutlass_80_...): the device that ran it is at least that.

display_names(short_name, names) gives each demangled name of a group sharing one short name a
readable label: the short name plus those template arguments (simplified: no namespaces, no casts,
lambdas as `function::lambda(args)`) that tell the names of the group apart.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from stallhound.formats import comm_kernels

NAME_CHARS = 200  # demangled names can run to kilobytes; the start identifies the kernel
DISPLAY_CHARS = 160  # a display name stays one readable line

KINDS = {
    "runtime": "a language runtime's own helper kernels (the NVHPC OpenACC/OpenMP runtime's fills): data set-up, not "
               "the program's compute",
    "nccl": "communication kernels: NCCL and the libraries beside it (MSCCL, DeepEP, NVSHMEM, custom all-reduce)",
    "attention": "fused attention (FlashAttention, fmha, cuDNN SDPA)",
    "conv": "convolutions (cuDNN fprop/dgrad/wgrad, scudnn/h884cudnn implicit GEMM, Winograd)",
    "gemm-tensor": "GEMMs on tensor cores (TF32, FP16/BF16, FP8, INT8; hmma/wgmma, nvjet, CUTLASS tensorop)",
    "gemm-fp32": "FP32 GEMMs on the FMA units (sgemm, simt, xmma ffma): no tensor cores",
    "gemm": "GEMMs and their split-K/epilogue kernels whose precision the name does not tell",
    "norm": "layer/RMS/batch/group norm and softmax",
    "copy": "copies, casts, concatenation, transposes and gathers",
    "reduction": "reductions and scans",
    "elementwise": "element-wise (pointwise) kernels, fills, fused optimizer steps",
    "custom": "everything else: the program's own kernels",
}

_RULES: tuple[tuple[str, re.Pattern[str]], ...] = tuple((kind, re.compile(pattern)) for kind, pattern in (
    ("runtime", r"__pgi_uacc_|__pgi_dev_"),
    # kernels an OpenMP/OpenACC compiler made from the program's loops: their names carry the program's own
    # function names (matmult, reduce), which say nothing about what kind of kernel the compiler generated
    ("custom", r"^nvkernel_|__omp_offloading_|_\d+_gpu(__red)?$"),
    ("nccl", comm_kernels.ANY),
    ("attention", r"flash|fmha|sdpa|attention|attn|(?<![a-z])mha"),
    ("conv", r"convol|conv[123]d|(?<![a-z])conv(?![a-z])|depthwise|fprop|dgrad|wgrad|winograd|implicit_gemm|"
             r"scudnn|\d{3,4}cudnn"),  # cuDNN's implicit-GEMM kernels: volta_scudnn_128x64_*, volta_h884cudnn_*
    ("gemm", r"gemm|nvjet|matmul|gemv|splitkreduce|cublaslt::epilogue|(?<![a-z])(b|add)?mm(?![a-z])"),
    ("norm", r"layer_?norm|rms_?norm|batch_?norm|group_?norm|instance_?norm|softmax|gammabeta|(?<![a-z])bn_[fb]w"),
    ("copy", r"copy|(?<![a-z])cast|catarray|concat|transpose|permute|gather|(?<![a-z])convert"),
    ("reduction", r"reduc|triton_(red|per)_|nvfuser_\w*persistent|devicescan|(?<![a-z])scan_"),
    ("elementwise", r"elementwise|pointwise|multi_tensor_apply|triton_poi_|(?<![a-z])loop_\w*fusion|"
                    r"(?<![a-z])wrapped_|^cupy_|fill_?functor|fill_kernel|(?<![a-z])scal_kernel"),
))
# Checked only on GEMMs, tensor-core marks first: `sm80_xmma_gemm_f32f32_tf32f32` is TF32 despite its f32s.
_TENSOR = re.compile(r"tensorop|hmma|imma|gmma|nvjet|[a-z]\d{3,5}gemm|"
                     r"(?<![a-z])(tf32|bf16|f16|fp16|half|fp8|e4m3|e5m2|int8|i8)")
_FP32 = re.compile(r"sgemm|simt|ffma|gemm_f32f32_f32f32")
# Checked only on convolutions: cuDNN's scudnn kernels (s: single precision) and engines templated on float
# (dgrad_engine<float, ...>, winogradForwardData4x4<float, float>) run FP32 math, unless a tensor-core or 16-bit mark
# says otherwise (s884cudnn, h1688cudnn, hmma, half).
_FP32_CONV = re.compile(r"scudnn|sgemm|<float\b")
_TENSOR_CONV = re.compile(r"\d{3,4}cudnn|hmma|half|fp16|bf16|tensorop|xmma")
_ARCH_WORDS = {"maxwell": 50, "pascal": 60, "volta": 70, "turing": 75, "ampere": 80, "ada": 89, "hopper": 90,
               "blackwell": 100}
NVJET_ARCH = 90  # cuBLAS's nvjet GEMMs are its Hopper-and-later (wgmma) kernels, also when unnamed by sm
_ARCH = re.compile(r"(?:^|[^a-z0-9])(?:sm|cutlass_)(\d{2,3})[a-z]?_|^(" + "|".join(_ARCH_WORDS) + r")_")


@lru_cache(maxsize=65_536)
def kind_of(name: str | None, short_name: str | None = None) -> str:
    """The kind (a key of KINDS) of a kernel from its demangled and short names."""
    text = _text(name, short_name)
    kind = next((k for k, pattern in _RULES if pattern.search(text)), "custom")
    if kind == "gemm":
        return "gemm-tensor" if _TENSOR.search(text) else "gemm-fp32" if _FP32.search(text) else "gemm"
    return kind


def fp32_conv(name: str | None, short_name: str | None = None) -> bool:
    """Whether a convolution kernel's names mark FP32 math and no tensor-core or 16-bit type."""
    text = _text(name, short_name)
    return bool(_FP32_CONV.search(text)) and not _TENSOR_CONV.search(text)


def _text(name: str | None, short_name: str | None) -> str:
    """The names as the rules read them: qualified name with its template arguments, then the short name, lower."""
    sig = parse(name or short_name or "")
    text = f"{sig.qualified}<{', '.join(sig.args)}>".lower() if sig.args else sig.qualified.lower()
    return f"{text} {short_name.lower()}" if short_name else text


def min_arch_of(name: str | None) -> int | None:
    """Lowest SM architecture (major * 10 + minor) the kernel name shows it was built for, or None."""
    text = (name or "").lower()
    found = [int(m[1]) if m[1] else _ARCH_WORDS[m[2]] for m in _ARCH.finditer(text)]
    if "nvjet" in text:
        found.append(NVJET_ARCH)
    return max(found, default=None)


# Libraries whose kernels' launch configuration (grid, block, registers) the library chooses, not the program that
# calls it: (label, pattern on the lower-cased demangled name). cuBLAS's and cuDNN's precompiled kernels start with
# their architecture (sm80_xmma_gemm_..., ampere_sgemm_...); ROCm's rocBLAS/hipBLASLt GEMMs are Tensile's Cijk_.
LIBRARIES: tuple[tuple[str, re.Pattern[str]], ...] = tuple((label, re.compile(pattern)) for label, pattern in (
    ("communication", comm_kernels.ANY),
    ("cuDNN", r"cudnn|miopen"),
    ("CUTLASS", r"cutlass"),
    ("cuBLAS", r"cublas|xmma|nvjet|(?:^|\s)(sm\d{2,3}|maxwell|pascal|volta|turing|ampere|hopper|blackwell)_|"
               r"gemmsn_|gemv2?[nt]_|splitkreduce|(?:^|\s)cijk_|rocblas|hipblaslt"),
    ("CUB/Thrust", r"(?<![a-z])(cub|thrust)::|devicereduce|devicescan|deviceradixsort"),
    ("FlashAttention", r"flash_fwd|flash_bwd|flash::|fmha"),
    ("PyTorch (ATen)", r"at::native::|vectorized_elementwise_kernel|unrolled_elementwise_kernel"),
))


@lru_cache(maxsize=65_536)
def library_of(name: str | None, short_name: str | None = None) -> str | None:
    """The library (a label of LIBRARIES) whose kernel this is by its names, or None: the program's own kernel (or
    one of a library the names do not tell)."""
    text = f"{name or ''} {short_name or ''}".lower().strip()
    return next((label for label, pattern in LIBRARIES if pattern.search(text)), None)


# --- names ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Signature:
    qualified: str  # function name with namespaces, without template arguments
    args: tuple[str, ...]  # top-level template arguments, as written
    params: str | None  # parameter list without parentheses; None when the name has none


_CLOSE = {"<": ">", "(": ")", "[": "]"}
_LAMBDA = re.compile(r"\[lambda\(([^()]*)\) \(instance (\d+)\)\]")
_CALL_OPERATOR = re.compile(r"::operator ?\(\)(?:\(\))?(?: const)?")
_LAMBDA_CHAIN = re.compile(r"(?:::lambda\([^()]*\)#\d+)*::(lambda\([^()]*\))#\d+")
_CAST = re.compile(r"\(([A-Za-z_][\w: ]*)\)(-?\d+)")
_NUMBER = re.compile(r"-?\d+|true|false")
_QUALIFIER = re.compile(r"\b[A-Za-z_]\w*::(?!lambda\()")


def _closes(text: str, i: int) -> bool:
    """Whether text[i] closes a bracket; a '>' right after '-' is an arrow."""
    return text[i] in ")]" or (text[i] == ">" and text[i - 1:i] != "-")


def _groups(text: str) -> list[tuple[int, int]] | None:
    """(open, close) positions of the top-level bracket groups, or None when brackets do not balance."""
    stack: list[tuple[str, int]] = []
    top: list[tuple[int, int]] = []
    for i, ch in enumerate(text):
        if ch in _CLOSE:
            stack.append((ch, i))
        elif _closes(text, i):
            if not stack or _CLOSE[stack[-1][0]] != ch:
                return None
            _, start = stack.pop()
            if not stack:
                top.append((start, i))
    return None if stack else top


def _matching(text: str, i: int) -> int | None:
    """Position of the bracket that closes the one at text[i], or None."""
    depth = 0
    for j in range(i, len(text)):
        if text[j] in _CLOSE:
            depth += 1
        elif _closes(text, j):
            depth -= 1
            if depth == 0:
                return j
    return None


def _split_args(text: str) -> tuple[str, ...]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "<([":
            depth += 1
        elif _closes(text, i):
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    parts.append(text[start:].strip())
    return tuple(p for p in parts if p)


@lru_cache(maxsize=65_536)
def parse(name: str) -> Signature:
    """Split a demangled kernel name into qualified name, template arguments and parameters."""
    text = name.replace("<unnamed>::", "").replace("(anonymous namespace)::", "").replace("<unnamed>", "anon")
    text = text.strip().removeprefix("void ").removesuffix(" const")
    groups = _groups(text)
    if not groups:
        return Signature(text, (), None)
    params = None
    start, end = groups[-1]
    if text[start] == "(" and end == len(text) - 1:
        params, text, groups = text[start + 1:end], text[:start], groups[:-1]
    if groups and text[groups[-1][0]] == "<" and groups[-1][1] == len(text) - 1:
        start, end = groups[-1]
        return Signature(text[:start], _split_args(text[start + 1:end]), params)
    return Signature(text, (), params)


def _drop_enclosing_params(text: str) -> str:
    """`f(at::TensorIteratorBase &)::lambda` -> `f::lambda`: the parameters of a function a lambda sits in."""
    out, i = [], 0
    while i < len(text):
        close = _matching(text, i) if text[i] == "(" else None
        if close is not None and text.startswith("::", close + 1):
            i = close + 1
            continue
        out.append(text[i])
        i += 1
    return "".join(out)


def _cast(match: re.Match[str]) -> str:
    if match[1].strip() == "bool":
        return "true" if match[2] != "0" else "false"
    return match[2]


def simplify(text: str, detailed: bool = False) -> str:
    """A template argument or parameter list made readable: no namespaces, casts or call operators;
    a lambda as `enclosing_function::lambda(args)` (with every nested lambda and its instance number
    when detailed)."""
    text = _CALL_OPERATOR.sub("", _drop_enclosing_params(_LAMBDA.sub(r"lambda(\1)#\2", text)))
    if not detailed:
        text = _LAMBDA_CHAIN.sub(r"::\1", text)
    text = _CAST.sub(_cast, text.replace("void ", ""))
    while True:
        shorter = _QUALIFIER.sub("", text)
        if shorter == text:
            return " ".join(text.split())
        text = shorter


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _distinguishing(args: dict[str, tuple[str, ...]]) -> list[int]:
    """Argument positions that tell the names apart: the most varied first (at equal variety a type
    before a number, as it says more), each kept only when it separates more names; stops once every
    name is told apart."""
    def variety(positions: list[int]) -> int:
        return len({tuple(a[i] if i < len(a) else None for i in positions) for a in args.values()})

    def numeric(pos: int) -> bool:
        return all(_NUMBER.fullmatch(a[pos]) for a in args.values() if pos < len(a))
    width = max(map(len, args.values()), default=0)
    chosen: list[int] = []
    for pos in sorted(range(width), key=lambda i: (-variety([i]), numeric(i), i)):
        if variety(chosen) == len(args):
            break
        if variety(chosen + [pos]) > variety(chosen):
            chosen.append(pos)
    return sorted(chosen)


def display_names(short_name: str, names: list[str] | set[str]) -> dict[str, str]:
    """name -> display name for the demangled names that share `short_name`.

    One name: the short name. Several: the short name with the template arguments that tell them
    apart, simplified; a name that still shares its label gets the arguments with every lambda and its
    instance number, then all arguments and the parameters, and failing that its demangled name (cut).
    """
    names = sorted(set(names))
    if len(names) == 1:
        return {names[0]: _cut(short_name, DISPLAY_CHARS)}
    sigs = {n: parse(n) for n in names}

    def labelled(detailed: bool) -> dict[str, str]:
        args = {n: tuple(simplify(a, detailed) for a in sigs[n].args) for n in names}
        positions = _distinguishing(args)
        shown = {n: [args[n][i] for i in positions if i < len(args[n])] for n in names}
        return {n: f"{short_name}<{', '.join(shown[n])}>" if shown[n] else short_name for n in names}

    def signature(n: str) -> str:
        sig = sigs[n]
        args = ", ".join(simplify(a, detailed=True) for a in sig.args)
        params = "" if sig.params is None else f"({simplify(sig.params)})"
        return f"{short_name}{f'<{args}>' if args else ''}{params}"

    levels = [labelled(False), labelled(True), {n: signature(n) for n in names}, {n: n for n in names}]
    out = {}
    for n in names:
        level = next((lv for lv in levels if list(lv.values()).count(lv[n]) == 1), levels[-1])
        out[n] = _cut(level[n], DISPLAY_CHARS)
    return out
