"""Top-1-of-N sparse feedforward layer of Scaling Transformers (Jaszczur et al. 2021, §3.1, Fig. 2),
with the details of the official trax code (docs/architecture.md, "Papers and their official code"):

    Controller(x) = argmax(Reshape(x·C1·C2 + c, (-1, N)))          (§3.1, controller; low-rank C1·C2)
    Y_sparse      = max(0, x·W1) ⊙ Controller(x)                     (§3.1, first equation; W1 has no bias)
    SparseFFN(x)  = Y_sparse·W2 + b2                                 (§3.1, second equation)

The d_ff hidden units form d_ff/N contiguous blocks of N units; exactly one unit per block is active.
Training: choice = argmax(log_softmax(logits) + T·Gumbel); with probability `quant_prob` per forward the
mask is the straight-through one-hot (forward one-hot, backward softmax), else the softmax itself.
Eval: choice = argmax(logits) (no noise), mask = one-hot. Two eval paths give the same numbers:
  dense  - all of x·W1 computed, then masked (cheaper when many tokens share the weights);
  gather - only the chosen row of W1 and of W2 per block is read, d_ff/N of each (decoding: few tokens).
`mode` "auto" takes gather when the step has at most N/4 tokens: it reads tokens·d_ff/N rows of each
matrix instead of d_ff, but copies them (read, write, read: ~3x the bytes) in pure PyTorch. With the
compiled extension (fairseq_ext/ops/sparse_ffn.py) an eval forward without autograd on up to N tokens
runs the fused kernel instead, which reads the chosen rows in place; on a CPU, any number of tokens
when N >= GATHER_MIN_BLOCK_CPU (batched decoding, the encoder: the dense FFN's arithmetic costs more
than the kernel's reads).

For use inside fairseq's Transformer layers (which call fc2(dropout(activation(fc1(x))))) the layer is
split in `fc1` (controller, W1, ReLU, mask) and `fc2` (W2, b2); `install_sparse_ffn` puts them in a layer
and makes the layer's activation the identity (the ReLU is applied before the mask: applying it again
after the mask would zero the straight-through gradient of the units the one-hot switched off).
In the gather path fc1 computes the whole FFN with `fairseq_ext.ops.sparse_ffn.sparse_ffn_decode` (the
compiled kernel, or its PyTorch reference) and hands the output to its fc2 (same layer call, in order).
"""
import torch
import torch.nn.functional as F
from torch import nn

from ..ops.sparse_ffn import kernel_applies, sparse_ffn_decode
from .reversible import decision

MODES = ("auto", "dense", "gather")
# On a CPU the compiled op serves any number of tokens when a block has at least this many units. Measured
# (benchmarks/sparse_ffn_speed.py, d 1024, d_ff 6656, 2 threads, AMD EPYC, 80 and 320 tokens): N = 32
# 1.5-2.0x faster than the dense FFN, N = 64 2.7-3.1x, N = 128 4.2-4.8x; N = 16 0.80-0.92x (dense wins).
GATHER_MIN_BLOCK_CPU = 32


def check_block_size(ffn_dim, block_size, flag="--sparse-ffn-block-size", width_flag="the FFN width"):
    """Build-time check: N must divide d_ff (d_ff/N blocks of N units)."""
    if block_size < 1:
        raise ValueError(f"{flag} {block_size}: the block size N must be >= 1")
    if ffn_dim % block_size:
        lo, hi = (ffn_dim // block_size) * block_size, (ffn_dim // block_size + 1) * block_size
        widths = f"{lo} or {hi}" if lo else f"{hi}"  # the multiples of N either side of the width
        raise ValueError(f"{flag} {block_size} must divide {width_flag} ({ffn_dim}): use a width that is a "
                         f"multiple of N (e.g. {widths}) or a block size dividing {ffn_dim}")


class SparseFFNInput(nn.Module):
    """Controller + first layer: x -> ReLU(x·W1) ⊙ mask. `weight` is W1 stored like nn.Linear's,
    (d_ff, d_model): one row per hidden unit."""

    def __init__(self, embed_dim, ffn_dim, block_size, lowrank_dim=None, temperature=0.1, quant_prob=0.3):
        super().__init__()
        check_block_size(ffn_dim, block_size)
        self.in_features, self.out_features = embed_dim, ffn_dim
        self.block_size, self.num_blocks = block_size, ffn_dim // block_size
        self.lowrank_dim = lowrank_dim or self.num_blocks  # trax default d_lowrank = d_ff / N
        if self.lowrank_dim < 1:
            raise ValueError(f"--sparse-ffn-lowrank {lowrank_dim}: must be >= 1")
        if temperature < 0 or not 0.0 <= quant_prob <= 1.0:
            raise ValueError(f"--sparse-ffn-temperature {temperature} must be >= 0 and --sparse-ffn-quant-prob "
                             f"{quant_prob} in [0, 1]")
        self.temperature, self.quant_prob = temperature, quant_prob
        self.mode = "auto"
        self.weight = nn.Parameter(torch.empty(ffn_dim, embed_dim))  # W1, no bias (trax)
        self.controller1 = nn.Parameter(torch.empty(self.lowrank_dim, embed_dim))  # C1
        self.controller2 = nn.Parameter(torch.empty(ffn_dim, self.lowrank_dim))  # C2
        self.controller_bias = nn.Parameter(torch.empty(ffn_dim))
        for w in (self.weight, self.controller1, self.controller2):
            nn.init.xavier_uniform_(w)  # Glorot uniform (trax)
        nn.init.normal_(self.controller_bias, std=1e-6)
        self._pending = None  # for fc2: the FFN's output (n, d) when the gather path computed it

    def extra_repr(self):
        return (f"{self.in_features} -> {self.out_features}, block_size={self.block_size}, "
                f"lowrank={self.lowrank_dim}, temperature={self.temperature}, quant_prob={self.quant_prob}")

    def controller_logits(self, x):  # x: (n, d) -> (n, d_ff/N, N), float32
        # in float32 whatever the model's dtype or autocast: the choice is discrete, and a half-precision
        # controller flips near-ties (trax keeps it in float32 too)
        with torch.autocast(x.device.type, enabled=False):
            logits = F.linear(F.linear(x.float(), self.controller1.float()), self.controller2.float(),
                              self.controller_bias.float())
        return logits.view(x.size(0), self.num_blocks, self.block_size)

    def _gumbel_max(self, log_p):
        """A sample of softmax(log_p / T) per block: argmax(log_p + T·g), Gumbel noise g = −log(−log u)
        (trax; uniform draws are 2x faster on CPU than Tensor.exponential_ for the inner −log u)."""
        u = torch.rand_like(log_p).clamp_(1e-6, 1 - 1e-6)
        return (log_p - self.temperature * torch.log(-torch.log(u))).argmax(-1)

    def choose(self, x):
        """Eval-mode choice per block: (n, d_ff/N) index in [0, N)."""
        return self.controller_logits(x).argmax(-1)

    def use_gather(self, num_tokens, kernel=False, device_type="cpu"):
        if self.mode not in MODES:
            raise ValueError(f"SparseFFNInput.mode {self.mode!r}: choose one of {MODES}")
        # the compiled op reads the chosen rows in place: worth it below N tokens (fewer rows than
        # d_ff); the PyTorch gather copies them (read, write, read again): below ~N/4 tokens
        limit = num_tokens if kernel else 4 * num_tokens
        # beyond N tokens the dense FFN is compute-bound (4·d·d_ff FLOPs a token) where the CPU kernel reads
        # 2·d_ff/N rows a token: the kernel stays faster for blocks of GATHER_MIN_BLOCK_CPU units or more
        many = kernel and device_type == "cpu" and self.block_size >= GATHER_MIN_BLOCK_CPU
        return self.mode == "gather" or (self.mode == "auto" and (limit <= self.block_size or many))

    def decode_weight_reads(self, tokens):
        """{id(parameter): elements read} of W1 and W2 by an eval forward over `tokens` tokens, for the
        decoding roofline of benchmarks/decode_speed.py (a module hook: any model may hold this FFN)."""
        from ..ops import kernels_enabled

        rows = self.out_features
        if self.use_gather(tokens, kernel=kernels_enabled(), device_type=self.weight.device.type):
            rows = min(tokens * self.num_blocks, self.out_features)
        return {id(self.weight): rows * self.in_features, id(self._output.weight): rows * self.in_features}

    def forward(self, x):
        shape = x.shape[:-1]
        x2 = x.reshape(-1, x.size(-1))  # (n, d)
        n = x2.size(0)
        self._pending = None
        if not self.training and self.use_gather(n, kernel=kernel_applies(x2, self.controller1.size(0)),
                                                 device_type=x2.device.type):
            # the whole FFN reading only the chosen rows: the csrc kernel, or its PyTorch reference
            out = self._output
            self._pending = sparse_ffn_decode(x2, self.controller1, self.controller2, self.controller_bias,
                                              self.weight, out.weight, out.bias, self.block_size)
            return x2.new_zeros(*shape, self.num_blocks)  # stands for h; fc2 returns the FFN's output
        logits = self.controller_logits(x2)  # (n, blocks, N)
        if self.training:
            log_p = F.log_softmax(logits.float(), dim=-1)
            soft = log_p.exp()
            # the coin first: the sample is needed only by the straight-through branch (as trax, whose soft
            # branch ignores it); a reversible layer's recomputation replays the same random numbers
            if torch.rand(()) < self.quant_prob:  # straight-through one-hot (forward), softmax (backward)
                choice = decision(self._gumbel_max(log_p))
                one_hot = torch.zeros_like(soft).scatter_(-1, choice.unsqueeze(-1), 1.0)
                mask = one_hot + soft - soft.detach()
            else:
                mask = soft
            h = F.relu(F.linear(x2, self.weight)) * mask.view(n, -1).to(x2.dtype)
            return h.view(*shape, self.out_features)
        choice = decision(logits.argmax(-1))  # (n, blocks); a decision a tape can record and replay
        h = F.relu(F.linear(x2, self.weight)).view(n, self.num_blocks, self.block_size)
        h = h * F.one_hot(choice, self.block_size).to(h.dtype)
        return h.view(*shape, self.out_features)


class SparseFFNOutput(nn.Module):
    """Second layer: Y_sparse·W2 + b2. `weight` is W2 stored as (d_ff, d_model), one row per hidden
    unit (so the gather path reads contiguous rows); `bias` is b2."""

    def __init__(self, sparse_input: SparseFFNInput):
        super().__init__()
        self.in_features, self.out_features = sparse_input.out_features, sparse_input.in_features
        self.weight = nn.Parameter(torch.empty(self.in_features, self.out_features))
        self.bias = nn.Parameter(torch.empty(self.out_features))
        nn.init.xavier_uniform_(self.weight)
        nn.init.normal_(self.bias, std=1e-6)
        object.__setattr__(self, "_input", sparse_input)  # not submodules: no second copy in state dicts
        object.__setattr__(sparse_input, "_output", self)

    def forward(self, h):
        y = self._input._pending
        if y is None:  # dense: (…, d_ff)
            return torch.matmul(h, self.weight) + self.bias
        self._input._pending = None  # fc1's gather path computed the whole FFN
        shape = h.shape[:-1]
        if h.numel() // h.size(-1) != y.size(0):
            raise RuntimeError(f"sparse FFN: fc2 got activations {tuple(h.shape)} for the {y.size(0)} tokens "
                               f"of its fc1 (fc1 and fc2 must be called in pairs)")
        return y.view(*shape, self.out_features)


class SparseFeedForward(nn.Module):
    """SparseFFN(x) (§3.1) as one module: fc2(dropout(fc1(x))). Usable alone or, through
    `install_sparse_ffn`, as the FFN of fairseq Transformer layers (shared by several layers if wanted)."""

    def __init__(self, embed_dim, ffn_dim, block_size=64, lowrank_dim=None, temperature=0.1, quant_prob=0.3,
                 activation_dropout=0.0):
        super().__init__()
        self.fc1 = SparseFFNInput(embed_dim, ffn_dim, block_size, lowrank_dim, temperature, quant_prob)
        self.fc2 = SparseFFNOutput(self.fc1)
        self.dropout = nn.Dropout(activation_dropout)

    @property
    def mode(self):
        return self.fc1.mode

    @mode.setter
    def mode(self, value):
        if value not in MODES:
            raise ValueError(f"mode {value!r}: choose one of {MODES}")
        self.fc1.mode = value

    def forward(self, x):  # (…, d) -> (…, d)
        return self.fc2(self.dropout(self.fc1(x)))


def _identity(x):
    return x


def install_sparse_ffn(layer, ffn: SparseFeedForward):
    """Make a fairseq Transformer layer use `ffn` as its FFN (fc1 -> activation -> dropout -> fc2)."""
    layer.fc1, layer.fc2 = ffn.fc1, ffn.fc2
    layer.activation_fn = _identity  # the ReLU is inside fc1, before the mask
