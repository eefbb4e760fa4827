"""stallhound: read GPU profiles (Nsight Systems exports, torch.profiler traces) for people and AI assistants."""

from importlib.metadata import version

__version__ = version("stallhound")  # pyproject.toml's, as installed: the one place it is written
