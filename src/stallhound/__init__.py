"""stallhound: read GPU profiles (Nsight Systems exports, torch.profiler traces) for people and AI assistants."""

from __future__ import annotations


def __getattr__(name: str) -> str:
    """`__version__`: pyproject.toml's, as installed (the one place it is written), read on first use: reading the
    metadata costs more than the rest of `stallhound --help`, which does not need it."""
    if name != "__version__":
        raise AttributeError(f"module 'stallhound' has no attribute {name!r}")
    from importlib.metadata import version

    globals()["__version__"] = found = version("stallhound")
    return found
