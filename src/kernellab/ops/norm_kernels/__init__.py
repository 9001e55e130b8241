"""What the norms share: layer_norm, rms_norm and add_rms_norm (ops/layer_norm/,
ops/rms_norm/, ops/add_rms_norm/) run one set of kernels (rms_norm is layer_norm's kernels
with ``RMS`` / ``rms=True``: no mean, no bias; add_rms_norm adds the residual in front).

    spec_parts.py       validation, inputs, byte and flop counts, the family's spec fields
    plumbing.py         the custom-op / eager-autograd plumbing around a backend's launchers
    triton_kernels.py   Triton kernels, config, launch plans, launchers
    cuda_kernels.py     CUDA C++ launchers and variants of norms.cu (NVRTC)

Importing this package registers nothing: each op's folder registers its own backends.
"""
