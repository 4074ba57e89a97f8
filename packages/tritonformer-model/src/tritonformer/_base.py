"""What the two models share beyond their compute: the forward skeleton, init, sampling, counts.

`Transformer` (kernel packages) and `TorchTransformer` (plain PyTorch) each build the same
modules under the same names and implement `hidden_states`, `forward_cached` (generation through
a KV cache), `cross_entropy` and `linear_cross_entropy`; everything here works on either.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence, Tuple, Union

import torch
from torch import nn

from . import generation, positions
from ._compat import is_compiling
from .config import TransformerConfig

# Matrices whose product is added to the residual stream: GPT-2 scales their init by 1/sqrt(2L).
RESIDUAL_PROJECTIONS = ("attn.proj.weight", "mlp.fc2.weight", "mlp.w_down")


class CausalLM(nn.Module):
    """A decoder-only language model: `logits, loss = model(idx, targets)`."""

    config: TransformerConfig
    embed: nn.Embedding
    lm_head: nn.Module
    # Whether an eager forward checks that its token ids lie in [0, vocab_size): one min/max read
    # back to the host, which waits for the GPU's queue to drain. Code that checks its ids where
    # it makes the batches may turn it off, as the train command does (it checks the whole token
    # file when it loads it).
    check_token_ids: bool = True

    def hidden_states(self, idx: torch.Tensor) -> torch.Tensor:
        """(B, S) token ids -> (B, S, d_model) after the final norm."""
        self._check_idx(idx)
        pos = torch.arange(idx.shape[1], device=idx.device)
        return self._hidden(idx, pos, self.position_tables(idx.shape[1], idx.device))

    def _hidden(self, idx: torch.Tensor, pos: torch.Tensor, position: Optional[tuple], cache=None) -> torch.Tensor:
        """The blocks and the final norm over idx (B, S) at positions pos ((S,) or (B, S))."""
        raise NotImplementedError

    def cross_entropy(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean loss of logits (N, V) against targets (N,), skipping ignore_index."""
        raise NotImplementedError

    def linear_cross_entropy(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean loss of lm_head(hidden (N, d)) against targets (N,), never holding all (N, V) logits."""
        raise NotImplementedError

    def forward(
        self, idx: torch.Tensor, targets: Optional[torch.Tensor] = None
    ) -> Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
        """idx (B, S) int64 token ids; targets (B, S) int64 next tokens (ignore_index: no loss).

        Returns (logits (B, S, vocab_size), loss) where loss is the mean cross-entropy over the
        targets that are not ignore_index, or None without targets. With config.fused_loss and
        targets, logits are never materialized and None is returned in their place.
        """
        return self.output(self.hidden_states(idx), targets)

    def output(
        self, h: torch.Tensor, targets: Optional[torch.Tensor] = None
    ) -> Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
        """forward's tail: (logits, loss) of the final hidden states h (B, S, d) (see forward)."""
        if targets is None:
            return self.lm_head(h), None
        if targets.shape != h.shape[:2]:
            raise ValueError(f"targets has shape {tuple(targets.shape)}; expected idx's {tuple(h.shape[:2])}")
        if self.config.fused_loss:
            return None, self.linear_cross_entropy(h.flatten(0, 1), targets.flatten())  # (B*S, d), (B*S,)
        logits = self.lm_head(h)  # (B, S, V)
        return logits, self.cross_entropy(logits.flatten(0, 1), targets.flatten())

    def _check_idx(self, idx: torch.Tensor) -> None:
        if not isinstance(idx, torch.Tensor) or idx.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"idx must be an int64 (or int32) tensor of token ids, got {getattr(idx, 'dtype', idx)}")
        if idx.dim() != 2:
            raise ValueError(f"idx must be (batch, seq_len), got shape {tuple(idx.shape)}")
        if idx.shape[1] > self.config.max_seq_len:
            raise ValueError(f"sequence length {idx.shape[1]} exceeds max_seq_len={self.config.max_seq_len}")
        if self.check_token_ids:
            self._check_token_ids(idx)

    def _check_token_ids(self, idx: torch.Tensor) -> None:
        """Every id in [0, vocab_size), from one min/max reduction. Reading it on the host waits for the
        device, which a CUDA graph capture forbids and torch.compile would trace as a graph break: both skip it."""
        if idx.numel() == 0 or is_compiling() or (idx.is_cuda and torch.cuda.is_current_stream_capturing()):
            return
        low, high = torch.stack(torch.aminmax(idx)).tolist()
        vocab_size = self.config.vocab_size
        if low < 0 or high >= vocab_size:
            bad = low if low < 0 else high
            raise ValueError(f"token id {bad} in idx is outside [0, vocab_size={vocab_size})")

    def _run_blocks(self, blocks: nn.ModuleList, state: tuple, position, cache=None) -> tuple:
        """state = block(*state, position) for each block; with activation checkpointing each
        block is recomputed in backward (its RNG state, hence its dropout masks, replayed). With a
        KV cache (generation) each block also gets its layer's view of it."""
        if cache is not None:
            for index, block in enumerate(blocks):
                state = block(*state, position, cache.layer(index))
                if not isinstance(state, tuple):
                    state = (state,)
            return state
        checkpointing = self.config.activation_checkpointing and self.training and torch.is_grad_enabled()
        # Only dropout draws random numbers: without it there is no RNG state to stash and replay
        # (reading the CUDA RNG state is also not allowed while a CUDA graph is being captured).
        preserve_rng_state = self.config.dropout > 0
        for block in blocks:
            if checkpointing:
                state = torch.utils.checkpoint.checkpoint(
                    block, *state, position, use_reentrant=False, preserve_rng_state=preserve_rng_state
                )
            else:
                state = block(*state, position)
            if not isinstance(state, tuple):
                state = (state,)
        return state

    # ----------------------------------------------------------------------------------------
    # Initialization, counts
    # ----------------------------------------------------------------------------------------

    def init_weights(self) -> None:
        """GPT-2 init: N(0, 0.02) for matrices and embeddings, residual projections 0.02/sqrt(2L),
        zero biases, unit norm weights."""
        std = 0.02
        residual_std = std / math.sqrt(2 * self.config.n_layer)
        for module_name, module in self.named_modules():
            for name, p in module.named_parameters(recurse=False):
                full_name = f"{module_name}.{name}"
                if module is self.lm_head and self.config.tie_embeddings:
                    continue  # the tied head keeps the embedding's init
                if isinstance(module, nn.Embedding):
                    nn.init.normal_(p, 0.0, std)
                elif p.dim() == 1 and name == "weight":  # a norm's scale
                    nn.init.ones_(p)
                elif p.dim() == 1:  # a bias
                    nn.init.zeros_(p)
                else:
                    is_residual = full_name.endswith(RESIDUAL_PROJECTIONS)
                    nn.init.normal_(p, 0.0, residual_std if is_residual else std)

    def num_params(self, matmul_only: bool = True) -> int:
        """Parameter count; matmul_only leaves out the embedding tables, which are lookups.

        A tied head counts once (it is a matmul), an untied one is counted with the matmuls.
        """
        total = sum(p.numel() for p in self.parameters())
        if matmul_only:
            if not self.config.tie_embeddings:
                total -= self.embed.weight.numel()
            if getattr(self, "pos_embed", None) is not None:
                total -= self.pos_embed.weight.numel()
        return total

    def flops_per_token(self, seq_len: int) -> float:
        """Model flops of one token's forward + backward: 6N + 12 * L * d * S (PaLM, appendix B)."""
        return self.config.flops_per_token(seq_len)

    # ----------------------------------------------------------------------------------------
    # Sampling
    # ----------------------------------------------------------------------------------------

    def generate(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: Optional[int] = None,
        generator: Optional[torch.Generator] = None,
        *,
        top_p: Optional[float] = None,
        eos_token_id: Optional[int] = None,
        pad_token_id: Optional[int] = None,
        prompt_lengths: Optional[Union[torch.Tensor, Sequence[int]]] = None,
        cuda_graph: bool = False,
    ) -> torch.Tensor:
        """Extend each prompt of idx (B, S) by up to max_new_tokens tokens, with a KV cache.

        One prefill over the prompts, then one decode step per token (generation.py).
        temperature: 0 picks the most likely token; otherwise tokens are drawn from the softmax
            of logits / temperature, restricted to the top_k most likely tokens and then to the
            top_p nucleus (the most likely tokens whose probabilities sum to at least top_p).
        eos_token_id: a row that emits it is finished: its later tokens are pad_token_id
            (default eos_token_id); generation stops when every row is finished.
        prompt_lengths: (B,) ints: row b's prompt is idx[b, :prompt_lengths[b]] (right padding;
            the padding's values are ignored). Default: every row is S tokens long.
        generator: the random draws' generator.
        cuda_graph: capture the decode step into a CUDA graph once and replay it for every token
            (CUDA only): the host's cost per token falls from every layer's launches to one
            replay, which is what batch-1 decoding is bound by. Same tokens as without it. The
            graph and its KV cache stay with the model for the next call of the same batch size,
            cache length (longest prompt + max_new_tokens, at most max_seq_len), autocast state and
            parameters, which then skips the capture; `release_decode_graph()` frees them.

        Returns (B, S + n) token ids, n <= max_new_tokens the steps run (fewer when every row
        finished): row b is its prompt, its new tokens, then padding (pad_token_id, else
        eos_token_id, else 0) to the right. Past max_seq_len the context is cropped to each
        row's last max_seq_len tokens, recomputed every step. Runs in eval mode without
        gradients (no dropout) and restores the previous mode; under torch.autocast the cache
        holds the autocast dtype.
        """
        return generation.generate(
            self, idx, max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p, eos_token_id=eos_token_id,
            pad_token_id=pad_token_id, prompt_lengths=prompt_lengths, generator=generator, cuda_graph=cuda_graph,
        )  # fmt: skip

    def release_decode_graph(self) -> None:
        """Free the decode graph and KV cache that generate(cuda_graph=True) keeps for the next call."""
        generation.release_decode_graph(self)

    def forward_cached(self, idx: torch.Tensor, cache) -> torch.Tensor:
        """Final hidden states (B, S, d) of idx through the KV cache (generation.KVCache): a
        prefill (cache.decoding False) runs positions 0 ... S - 1 and writes their keys and values;
        a decode step (S = 1) runs each row's token at position cache.lengths[b] and appends."""
        if not cache.decoding:
            pos = torch.arange(idx.shape[1], device=idx.device)
            return self._hidden(idx, pos, self.position_tables(idx.shape[1], idx.device), cache)
        pos = cache.lengths.long()[:, None]  # (B, 1): each row's position
        return self._hidden(idx, pos, self._decode_position(cache, pos), cache)

    def _decode_position(self, cache, pos: torch.Tensor) -> Optional[tuple]:
        """What a decode step's attention needs of the positions pos (B, 1), from cache.tables."""
        raise NotImplementedError

    def decode_tables(self, capacity: int, device: torch.device) -> Optional[tuple]:
        """What decode steps need of the positions, computed once per generate call: the rotary
        cos, sin tables (capacity, D) for rope, the ALiBi slopes (H,), None for learned positions."""
        c = self.config
        if c.position == "rope":
            return positions.rope_cos_sin(capacity, c.head_dim, c.rope_base, device)
        if c.position == "alibi":
            return (positions.alibi_slopes_tensor(c.n_head, device),)
        return None

    def _decode_rope(self, tables: tuple, pos: torch.Tensor) -> tuple:
        """The rotary tables' rows at positions pos (B, 1): cos, sin (B, 1, D)."""
        cos, sin = tables
        return cos[pos], sin[pos]
