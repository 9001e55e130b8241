"""Ops: one folder each, one per family where ops share kernels (norms/: layer_norm and
rms_norm; reductions/: sum, max and argmax); importing a folder's package registers its
ops and their backends."""
