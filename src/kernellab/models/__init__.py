"""End-to-end models built on kernellab's ops."""
