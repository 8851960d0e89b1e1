"""Fused arithmetic of the client hooks: parameters gathered into one flat buffer, gradient terms
added to the gradients with ``torch._foreach_add_``.

The hooks' per-step work is a few element-wise passes over every weight; as one Python-level
op per parameter tensor (and through autograd) it cost FedProx, FedDyn and SCAFFOLD 37-69 % more
client time than FedAvg (docs/results.md). Element-wise float ops round the same whatever the
layout, so a whole-buffer op gives bit for bit the per-tensor results
(tests/strategies/test_fused_hooks.py); only reductions (a dot product, a norm) sum in another
order.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

#: elements per :class:`Block` (256 KiB of float32): a block of one buffer and the same block of
#: another stay in cache from one op of a hook's step to the next (FedDyn on newcrfs-lite: 7.2
#: against 7.3-8.1 ms of hook time per step unblocked; whole rounds differ within the noise of
#: a shared machine, benchmarks/client_hooks.py)
BLOCK = 1 << 16


class Block:
    """Consecutive parameters of a :class:`FlatParams`, at least :data:`BLOCK` elements (or the
    last ones): their views and the 1-D slice of the buffer that holds them (:attr:`part`)."""

    def __init__(
        self,
        part: torch.Tensor,
        params: list[torch.Tensor],
        views: list[torch.Tensor],
        memory: list[torch.Tensor] | None,
    ) -> None:
        self.part = part
        self.params = params
        self.views = views
        self._memory = memory

    def gather(self) -> torch.Tensor:
        """Copy the parameters' current values in; returns :attr:`part`."""
        with torch.no_grad():
            if self._memory is not None:
                torch.cat(self._memory, out=self.part)
            elif self.views:
                torch._foreach_copy_(self.views, self.params)
        return self.part


class FlatParams:
    """A float32 buffer with one view per parameter, each laid out like its parameter.

    :meth:`gather` copies the parameters' current values in with a ``torch.cat`` of their memory
    per :class:`Block` (a channels-last weight stays channels-last), :meth:`copy_` any tensors
    shaped like them; arithmetic on all of them is then one op on :attr:`flat`, or one per block
    (:attr:`blocks`). Elements, and blocks, of two buffers built from the same parameters line
    up.
    """

    def __init__(self, params: Sequence[torch.Tensor]) -> None:
        device = params[0].device if params else torch.device("cpu")
        self.params = list(params)
        self.flat = torch.empty(sum(p.numel() for p in params), dtype=torch.float32, device=device)
        self.views: list[torch.Tensor] = []
        self.blocks: list[Block] = []
        start = offset = first = 0
        for i, p in enumerate(self.params):
            self.views.append(self.flat.as_strided(p.shape, _dense_strides(p), offset))
            offset += p.numel()
            if offset - start >= BLOCK or i == len(self.params) - 1:
                self.blocks.append(self._block(start, offset, first, i + 1))
                start, first = offset, i + 1

    def _block(self, start: int, stop: int, first: int, last: int) -> Block:
        params, views = self.params[first:last], self.views[first:last]
        # each parameter's memory as a 1-D view (it follows the optimizer's in-place steps), for
        # one torch.cat into the block; only where they are dense float32 on the buffer's device
        memory: list[torch.Tensor] | None = None
        if all(
            tuple(p.stride()) == v.stride() and p.dtype == torch.float32 and p.device == v.device
            for p, v in zip(params, views, strict=True)
        ):
            memory = [
                p.detach().as_strided((p.numel(),), (1,), p.storage_offset()) for p in params
            ]
        return Block(self.flat[start:stop], params, views, memory)

    def gather(self) -> FlatParams:
        """Copy the parameters' current values in; returns self."""
        for block in self.blocks:
            block.gather()
        return self

    def copy_(self, tensors: Sequence[torch.Tensor]) -> FlatParams:
        """Copy ``tensors`` (shaped like the parameters) in as float32; returns self."""
        if self.views:
            with torch.no_grad():
                torch._foreach_copy_(self.views, list(tensors))
        return self


def add_to_grads(params: Sequence[torch.Tensor], terms: Sequence[torch.Tensor]) -> None:
    """``p.grad += term`` for every parameter, fused (a hook's gradient term).

    A parameter the loss did not reach (``grad`` None) gets a copy of its term as its gradient,
    what autograd gives it when the term is part of the loss.
    """
    grads = [p.grad for p in params]
    with torch.no_grad():
        if all(g is not None for g in grads):
            if grads:
                torch._foreach_add_(grads, list(terms))  # type: ignore[arg-type]
            return
        have = [(g, t) for g, t in zip(grads, terms, strict=True) if g is not None]
        if have:
            torch._foreach_add_([g for g, _ in have], [t for _, t in have])
        for p, t in zip(params, terms, strict=True):
            if p.grad is None:
                p.grad = t.to(p.dtype, copy=True)


def _dense_strides(t: torch.Tensor) -> tuple[int, ...]:
    """``t``'s strides where it is dense and non-overlapping (any dim order), else row-major."""
    expected = 1
    for i in sorted(range(t.dim()), key=t.stride):
        if t.size(i) != 1 and t.stride(i) != expected:
            break
        expected *= t.size(i)
    else:
        return tuple(t.stride())
    strides, step = [], 1
    for n in reversed(t.shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))
