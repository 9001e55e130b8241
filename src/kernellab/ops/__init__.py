"""Ops: one folder each; importing an op's package registers it and its backends. Kernels
several ops share live in a package or module of their own: norm_kernels/ (layer_norm,
rms_norm, add_rms_norm), batch_norm_kernels/ (batch_norm2d, bn_relu_pool2d), glu_kernels/
(swiglu, geglu) and _reductions.py (sum, max, argmax; argmax's backends are max's
kernels)."""
