"""Ops: one folder each; importing an op's package registers its backends."""
