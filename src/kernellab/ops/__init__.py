"""Ops: one folder each, one per family where ops share kernels (norms/: layer_norm and
rms_norm); importing a folder's package registers its ops and their backends. sum, max
and argmax share ops/_reductions.py, and argmax's backends are max's kernels."""
