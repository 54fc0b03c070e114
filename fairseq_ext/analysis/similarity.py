"""Representational similarity measures of One Wide FFN §2.3 (Pires et al. 2023).

Both take feature matrices with one row per sentence (n × d; d may differ between the two).
"""
import torch


def linear_cka(a, b):
    """Linear Centered Kernel Alignment (Kornblith et al. 2019; One Wide FFN §2.3, unnumbered):
    CKA(A, B) = ||Bᵀ A||²_F / (||Aᵀ A||_F ||Bᵀ B||_F) on column-centered A, B. Computed in float64.
    Invariant to orthogonal transforms and isotropic scaling of either side; 1 for identical spaces."""
    a = a.double() - a.double().mean(0, keepdim=True)
    b = b.double() - b.double().mean(0, keepdim=True)
    cross = (b.T @ a).pow(2).sum()
    norm = torch.linalg.matrix_norm(a.T @ a) * torch.linalg.matrix_norm(b.T @ b)
    return (cross / norm).item() if norm > 0 else float("nan")


def knn_sets(x, k):
    """Indices of the k nearest neighbours of every row under cosine similarity (itself excluded)."""
    x = torch.nn.functional.normalize(x.double(), dim=1)
    sim = x @ x.T
    sim.fill_diagonal_(-float("inf"))
    return sim.topk(k, dim=1).indices


def local_neighborhood_similarity(a, b, k=None, fraction=0.05):
    """LNS (One Wide FFN §2.3, unnumbered): mean over sentences of the Jaccard similarity (intersection over
    union) of the sentence's k-nearest-neighbour sets in the two spaces; k = 5% of the set by default."""
    n = a.size(0)
    if b.size(0) != n:
        raise ValueError(f"LNS needs the same sentences on both sides ({n} vs {b.size(0)})")
    k = k or max(1, int(round(fraction * n)))
    if not 1 <= k < n:
        raise ValueError(f"k = {k} must be in [1, {n - 1}] for {n} sentences")
    na, nb = knn_sets(a, k), knn_sets(b, k)
    scores = []
    for i in range(n):
        sa, sb = set(na[i].tolist()), set(nb[i].tolist())
        scores.append(len(sa & sb) / len(sa | sb))
    return sum(scores) / n
