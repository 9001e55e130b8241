"""Profiling: torch.profiler tables and traces, NVTX ranges, Nsight Compute summaries."""
