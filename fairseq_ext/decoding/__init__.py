"""Decoding: the fast beam-search path (fast_generator.py) and its fairseq-generate entry point (generate.py)."""
