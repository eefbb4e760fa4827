"""What kind of program made this profile (PyTorch, JAX, TensorRT, CuPy, Numba, cuDF, other Python, Julia, C++
parallel algorithms (stdpar), OpenMP/OpenACC offload, CUDA C/C++/Fortran, or unknown), in which host language, with
which frameworks, and the evidence that decided it.

The kind picks the fix family of every finding (book/__init__.py): a C++ program never gets a PyTorch fix. It is
decided by the weight of the evidence (analysis/program_clues.py), never by one kernel or one name: each clue adds
its weight to a framework, a host language or both. The heaviest language wins (python, julia or native); then the
heaviest framework that language can drive, if it weighs at least MIN_FRAMEWORK_WEIGHT, names the kind, else the
language's own kind does. `evidence` lists every clue with its weight, so conflicting evidence shows on both sides;
`decided_by` says which weights won.
"""

from __future__ import annotations

from typing import Literal

import duckdb
from pydantic import BaseModel, Field

from stallhound.analysis import fix_context
from stallhound.analysis.common import per_model
from stallhound.analysis.program_clues import Clue, Facts, gather

Kind = Literal["pytorch", "jax", "tensorrt", "cupy", "numba", "cudf", "python", "julia", "stdpar", "offload", "cuda",
               "unknown"]

# Fix families to try, most specific first (see book/__init__.py); every chain ends with generic. Python
# frameworks without fixes of their own get the Python ones, which name CuPy, Numba and JAX calls; stdpar code can
# call the CUDA runtime, so a CUDA fix is the fallback where no stdpar one is written.
FIX_CHAINS: dict[str, tuple[str, ...]] = {
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
FRAMEWORK_NAMES = {"pytorch": "PyTorch", "jax": "JAX", "tensorrt": "TensorRT", "cupy": "CuPy", "numba": "Numba",
                   "cudf": "cuDF", "julia": "Julia", "stdpar": "C++ parallel algorithms (stdpar)",
                   "offload": "OpenMP/OpenACC offload"}
# Frameworks each host language can drive, and the kind a framework gives there (a framework not listed does not
# name the kind: the language's own kind does). libtorch and libcudf in a native program get the CUDA C++ fixes.
DRIVEN_BY: dict[str | None, dict[str, Kind]] = {
    "python": {"pytorch": "pytorch", "jax": "jax", "tensorrt": "tensorrt", "cupy": "cupy", "numba": "numba",
               "cudf": "cudf"},
    "julia": {"julia": "julia"},
    "native": {"tensorrt": "tensorrt", "stdpar": "stdpar", "offload": "offload", "pytorch": "cuda", "cudf": "cuda"},
    None: {"pytorch": "pytorch", "jax": "jax", "tensorrt": "tensorrt", "cupy": "cupy", "numba": "numba",
           "cudf": "cudf", "julia": "julia", "stdpar": "stdpar", "offload": "offload"},
}
LANGUAGE_KIND: dict[str, Kind] = {"python": "python", "julia": "julia", "native": "cuda"}
LANGUAGE_ORDER = ("python", "julia", "native")  # ties go to the first: an interpreter can host native code
# A framework weighing less is another framework's library call (one TensorRT-LLM kernel in a PyTorch decode step:
# 2% of kernel time), not the program's own model.
MIN_FRAMEWORK_WEIGHT = 0.05


class Program(BaseModel):
    kind: Kind = Field(description="the program kind that picks the fix family of every finding")
    language: Literal["python", "julia", "native", "unknown"] = Field(
        "unknown", description="host language of the process that drove the GPU: python, julia, native (C, C++, "
                               "Fortran) or unknown")
    fix_chain: list[str] = Field(description="book fix families tried in order, most specific first")
    fix_context: list[str] = Field([], description="facts of the trace that fit each fix (fix_context.tags): 'amd' "
                                                   "(ROCm's knobs, not CUDA's), 'kineto' (torch.profiler's capture)")
    frameworks: list[str] = Field(description="frameworks and libraries seen, most kernels first")
    process: str | None = Field(description="name of the process that did the most GPU work")
    evidence: list[str] = Field(description="what was seen, one short line each; [x +w] when it adds weight w to x")
    decided_by: str = Field(description="the weights that set `kind`")


def detect(con: duckdb.DuckDBPyConnection) -> Program:
    """The program behind the profile (computed once per model)."""
    return per_model(con, ("program",), lambda: _detect(con))


def _detect(con: duckdb.DuckDBPyConnection) -> Program:
    facts = gather(con)
    kind, language, decided = _decide(facts)
    return Program(kind=kind, language=language or "unknown", fix_chain=list(FIX_CHAINS[kind]),
                   fix_context=list(fix_context.tags(con)), frameworks=facts.frameworks, process=facts.process,
                   evidence=[_line(c) for c in facts.clues], decided_by=decided)


def _line(c: Clue) -> str:
    targets = " and ".join(dict.fromkeys(filter(None, (c.framework, c.language))))
    return f"{c.line} [{targets} +{c.weight:.2f}]" if c.weight else c.line


def _weights(clues: list[Clue], axis: str) -> dict[str, float]:
    """Total weight per framework (axis 'framework') or language (axis 'language'), heaviest first."""
    totals: dict[str, float] = {}
    for c in clues:
        target = getattr(c, axis)
        if target and c.weight:
            totals[target] = totals.get(target, 0.0) + c.weight
    return dict(sorted(totals.items(), key=lambda kv: -kv[1]))


def _decide(facts: Facts) -> tuple[Kind, str | None, str]:
    languages = _weights(facts.clues, "language")
    language = max(languages, key=lambda k: (languages[k], -LANGUAGE_ORDER.index(k)), default=None)
    driven = DRIVEN_BY[language]
    frameworks = {f: w for f, w in _weights(facts.clues, "framework").items() if f in driven}
    framework = next((f for f, w in frameworks.items() if w >= MIN_FRAMEWORK_WEIGHT), None)
    said = [_verdict(f"language {language}", languages, language)] if language else []
    if framework:
        kind = driven[framework]
        said.insert(0, _verdict(FRAMEWORK_NAMES[framework], frameworks, framework))
    elif language and (facts.gpu_work or language != "native"):
        kind = LANGUAGE_KIND[language]
        said.append("no framework of its own weighs enough" if frameworks else "no framework seen")
    elif facts.gpu_work:
        kind = "cuda"
        said.append("GPU work with no interpreter and no framework seen: native code")
    else:
        kind = "unknown"
        said.append("no GPU work and no framework seen: the programming model cannot be told")
    return kind, language, "; ".join(said)


def _verdict(what: str, weights: dict[str, float], winner: str) -> str:
    rivals = [f"{k} {w:.2f}" for k, w in weights.items() if k != winner]
    return f"{what} weighs {weights[winner]:.2f}" + (f" against {', '.join(rivals)}" if rivals else "")
