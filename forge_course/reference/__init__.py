"""Reference implementations: the single source of truth that every exercise is compared with.

One module per topic. Each public function is small enough to read in one pass and is tested
against PyTorch's own machinery where PyTorch has one.
"""
