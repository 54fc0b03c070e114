"""Representational similarity (linear CKA, LNS) between fairseq models: `python -m fairseq_ext.analysis`."""
from .similarity import linear_cka, local_neighborhood_similarity  # noqa: F401
