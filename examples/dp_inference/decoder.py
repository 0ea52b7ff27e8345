"""A tiny decoder-only language model and its greedy decode loop (MindSpore, PyNative).

Small enough that N copies decode a few tokens on a shared CPU in seconds, shaped like
the real thing where it matters for debugging: token + position embedding, a stack of
pre-norm blocks (causal self-attention, then an MLP), a final norm and an LM head, and a
generate loop whose first forward call is the *prefill* (the whole prompt) and whose
later calls are *decode* iterations (one new token each).

There is deliberately no KV cache: every forward call is a pure function of the token
ids so far, so two replicas given the same prompts run bit-identical computations and
any difference in a recorded statistic is a real fault, not cache bookkeeping. (The
call structure a probe sees — one root-model forward per generated token — is the same
as with a cache.)
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn, ops

#: Seed every replica initialises its weights from; a fault may change it on one worker.
WEIGHT_SEED = 2024


@dataclass(frozen=True)
class DecoderConfig:
    vocab: int = 64
    d_model: int = 32
    n_heads: int = 2
    n_layers: int = 2
    d_ff: int = 64
    max_len: int = 64

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} must be divisible by n_heads={self.n_heads}")


class CausalSelfAttention(nn.Cell):
    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.head_dim = cfg.d_model // cfg.n_heads
        self.qkv = nn.Dense(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Dense(cfg.d_model, cfg.d_model)
        self.scale = 1.0 / math.sqrt(self.head_dim)

    def construct(self, x: Tensor) -> Tensor:
        b, t, d = x.shape
        q, k, v = ops.split(self.qkv(x), d, axis=-1)
        # (B, T, D) -> (B, H, T, Dh)
        q = q.reshape(b, t, self.n_heads, self.head_dim).swapaxes(1, 2)
        k = k.reshape(b, t, self.n_heads, self.head_dim).swapaxes(1, 2)
        v = v.reshape(b, t, self.n_heads, self.head_dim).swapaxes(1, 2)
        scores = ops.matmul(q, k.swapaxes(-1, -2)) * self.scale
        # Causal mask: position i may not attend to j > i. Built per call because T grows.
        future = Tensor(np.triu(np.ones((t, t), np.bool_), 1))
        scores = ops.masked_fill(scores, future, Tensor(-1e4, scores.dtype))
        out = ops.matmul(ops.softmax(scores, -1), v)
        return self.proj(out.swapaxes(1, 2).reshape(b, t, d))


class MLP(nn.Cell):
    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.fc1 = nn.Dense(cfg.d_model, cfg.d_ff)
        self.act = nn.GELU()
        self.fc2 = nn.Dense(cfg.d_ff, cfg.d_model)

    def construct(self, x: Tensor) -> Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Cell):
    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm((cfg.d_model,))
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm((cfg.d_model,))
        self.mlp = MLP(cfg)

    def construct(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyDecoder(nn.Cell):
    """ids (B, T) int32 -> logits (B, T, vocab)."""

    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.max_len, cfg.d_model)
        self.layers = nn.CellList([Block(cfg) for _ in range(cfg.n_layers)])
        self.ln_f = nn.LayerNorm((cfg.d_model,))
        self.head = nn.Dense(cfg.d_model, cfg.vocab, has_bias=False)

    def construct(self, ids: Tensor) -> Tensor:
        t = ids.shape[1]
        positions = Tensor(np.arange(t, dtype=np.int32)[None, :])
        x = self.tok_emb(ids) + self.pos_emb(positions)
        for block in self.layers:
            x = block(x)
        return self.head(self.ln_f(x))


def build_model(cfg: DecoderConfig | None = None, *, seed: int = WEIGHT_SEED,
                dtype: ms.Type = ms.float32) -> TinyDecoder:
    """A model whose weights depend only on ``seed``: replicas built alike are identical."""
    ms.set_seed(seed)
    model = TinyDecoder(cfg or DecoderConfig())
    model.set_train(False)
    if dtype != ms.float32:
        cast_parameters(model, dtype)
    return model


def cast_parameters(model: nn.Cell, dtype: ms.Type) -> None:
    """Store every parameter in ``dtype`` (a worker loaded with the wrong precision)."""
    for param in model.get_parameters():
        param.set_data(param.astype(dtype))


def make_prompts(batch: int = 2, length: int = 4, vocab: int = 64, seed: int = 7) -> np.ndarray:
    """The debugging session's fixed prompts: every worker gets exactly these ids."""
    return np.random.RandomState(seed).randint(1, vocab, size=(batch, length)).astype(np.int32)


#: Called before forward call ``it`` (0 = prefill, 1.. = decode) with the model.
IterationHook = Callable[[int, TinyDecoder], None]


def greedy_generate(model: TinyDecoder, prompts: np.ndarray, max_new_tokens: int,
                    before_call: IterationHook | None = None) -> np.ndarray:
    """Greedy decoding; returns the generated ids (B, max_new_tokens).

    Forward call 0 runs the whole prompt (prefill) and yields the first new token;
    call k >= 1 is decode iteration k. ``before_call`` is the seam a fault (or a test)
    uses to act at a given iteration.
    """
    if prompts.ndim != 2 or prompts.dtype != np.int32:
        raise ValueError(f"prompts must be int32 (batch, length), got {prompts.dtype}{prompts.shape}")
    limit = model.cfg.max_len
    if prompts.shape[1] + max_new_tokens > limit:
        raise ValueError(f"max_new_tokens={max_new_tokens}: prompt length {prompts.shape[1]} + "
                         f"new tokens exceeds max_len={limit}")
    ids = prompts
    for it in range(max_new_tokens):
        if before_call is not None:
            before_call(it, model)
        logits = model(Tensor(ids))
        # argmax on the host: ties break to the lowest id, the same on every replica.
        nxt = logits[:, -1, :].astype(ms.float32).asnumpy().argmax(-1).astype(np.int32)
        ids = np.concatenate([ids, nxt[:, None]], axis=1)
    return ids[:, prompts.shape[1]:]
