"""Ops: one folder each, one per family where ops share kernels (reductions/: sum, max and
argmax), or shared kernels in a package of their own (norm_kernels/: layer_norm, rms_norm
and add_rms_norm; glu_kernels/: swiglu and geglu); importing an op's package registers it
and its backends."""
