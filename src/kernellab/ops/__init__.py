"""Ops: one folder each; importing an op's package registers it and its backends. Kernels
several ops share live in a package or module of their own: norm_kernels/ (layer_norm,
rms_norm, add_rms_norm), glu_kernels/ (swiglu, geglu) and _reductions.py (sum, max,
argmax; argmax's backends are max's kernels)."""
