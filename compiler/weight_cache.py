"""Values computed from weights, kept once per set of live weight tensors.

Dynamo compiles a module class's forward once and serves every instance of that class with the
same compiled graph: the layers of a model compiled one by one (regional compilation,
`for layer in model.layers: layer.compile()`), an EMA or teacher copy beside the model, an
ensemble. So one compiled graph meets the weights of many instances, call after call. Its
weight-derived values (prepack.py's packed copies, hoist.py's frontier) are therefore kept per
set of weight tensors: a cache holding one set only would be rebuilt on every call of another
instance (BERT-base, 12 layers compiled one by one, 2 threads, 2026-11-27: 60 weight packs per
forward, 139.5 ms against eager's 101.0).

`PerTensors.get(tensors, extra, make)` returns `make()`'s value for these tensor objects, made
again when one of them has another storage or was written in place (its version counter), or
`extra` (what the value depends on besides the tensors) changed. An entry goes when any of its
tensors is freed, so the cache holds what the live weights need, as separate compilations would.
An inference tensor has no version counter to tell an in-place write by: its value is made on
every call. A cache keeps at most MAX_ENTRIES sets, the oldest made going first: a graph that
meets more live weight sets than a deep model has layers is being fed new weights call after call
(each kept alive by the caller), and a packed copy per set would grow without bound.
"""
from __future__ import annotations

import weakref

import torch

MAX_ENTRIES = 256


class PerTensors:
    """tensors (by identity) -> (weak references, key, value); see the module docstring."""

    def __init__(self):
        self.entries = {}

    def get(self, tensors, extra, make):
        # A hit runs no Python function (nor generator step) per tensor: wrapper.py's prologue says
        # why (a call per weight can map and unmap a frame-stack chunk per weight).
        ids = tuple(map(id, tensors))
        inference = any(map(torch.Tensor.is_inference, tensors))   # no version: made every call
        key = (tuple([(t.data_ptr(), None if inference else t._version) for t in tensors]), extra)
        entry = self.entries.get(ids)
        if entry is None or inference or entry[1] != key or tuple([id(r()) for r in entry[0]]) != ids:
            refs = tuple(weakref.ref(t, self._dropper(ids)) for t in tensors)
            self.entries.pop(ids, None)
            if len(self.entries) >= MAX_ENTRIES:
                del self.entries[next(iter(self.entries))]
            entry = self.entries[ids] = (refs, key, make())
        return entry[2]

    def values(self) -> list:
        return [entry[2] for entry in self.entries.values()]

    def __len__(self):
        return len(self.entries)

    def _dropper(self, ids):
        entries = self.entries

        def drop(ref):
            # only the entry this reference belongs to: the id may since name a newer tensor
            entry = entries.get(ids)
            if entry is not None and any(r is ref for r in entry[0]):
                del entries[ids]
        return drop
