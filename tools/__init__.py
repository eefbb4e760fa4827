"""Analysis skills: one module per skill, each exposed as one MCP tool."""

TOOL_NAMES = (
    "profile_summary",
    "gpu_utilization",
    "top_kernels",
    "gpu_idle_gaps",
    "kernel_launch_overhead",
    "memory_transfers",
    "sync_analysis",
    "nccl_breakdown",
    "thread_utilization",
    "nvtx_breakdown",
    "iterations",
    "find_kernels",
    "describe_schema",
    "query_sql",
    "triage",
    "answer_questions",
)
