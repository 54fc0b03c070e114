"""FFN sharing plans (One Wide FFN, Pires et al. 2023, §2.2 and appendix "Custom Sharing of Multiple FFNs").

A plan says, for each of the N layers of one side (encoder or decoder), which FFN instance the layer
uses (an index into that side's pool of FFNs), or None when the layer has no FFN at all (its residual
connection and LayerNorm are removed too, paper footnote on d_ff' = 0).
"""

SHARING_MODES = ("independent", "shared", "sequence", "cycle", "cycle_rev", "none")
MULTI_FFN_MODES = ("sequence", "cycle", "cycle_rev")


def ffn_sharing_plan(num_layers, mode, num_ffns=None, flag="--encoder-ffn-sharing",
                     num_flag="--encoder-num-shared-ffns"):
    """FFN index (or None) per layer.

    independent: FFN_i for every layer i (the vanilla Transformer)
    shared:      FFN_all for every layer (SharedEnc / SharedDec)
    sequence:    M FFNs, one per block of N/M consecutive layers: m = floor((i-1) / (N/M))
    cycle:       M FFNs repeated in order: m = (i-1) mod M
    cycle_rev:   M = N/2 FFNs, in order then reversed (palindrome): 0 1 .. M-1 M-1 .. 1 0
    none:        no FFN (NoEnc / NoDec)
    Raises ValueError naming the flags for invalid combinations.
    """
    if mode not in SHARING_MODES:
        raise ValueError(f"{flag} {mode}: choose one of {', '.join(SHARING_MODES)}")
    if mode in MULTI_FFN_MODES:
        m = num_ffns
        if m is None or m < 1:
            raise ValueError(f"{flag} {mode} needs {num_flag} M >= 1 (the number of FFNs to share)")
        if num_layers % m != 0:
            raise ValueError(f"{flag} {mode}: {num_flag} {m} must divide the number of layers ({num_layers})")
        if mode == "cycle_rev" and 2 * m != num_layers:
            raise ValueError(f"{flag} cycle_rev is defined only for M = N/2: {num_flag} {m} with "
                             f"{num_layers} layers (use {num_layers // 2}, or --*-ffn-sharing cycle)")
    elif num_ffns is not None:
        raise ValueError(f"{num_flag} applies only to {flag} sequence|cycle|cycle_rev, not to '{mode}'")

    if mode == "independent":
        return list(range(num_layers))
    if mode == "shared":
        return [0] * num_layers
    if mode == "none":
        return [None] * num_layers
    if mode == "sequence":
        block = num_layers // num_ffns
        return [i // block for i in range(num_layers)]
    if mode == "cycle":
        return [i % num_ffns for i in range(num_layers)]
    return list(range(num_ffns)) + list(reversed(range(num_ffns)))  # cycle_rev
