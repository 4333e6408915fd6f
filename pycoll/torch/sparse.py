"""Sparse COO allreduce, the way Gloo does it: gather every rank's indices and values, sum.

A sparse tensor's nonzero count differs from rank to rank, so the ranks cannot reduce it
element-wise. Gloo gathers the counts, then the indices and the values, and coalesces the
union (duplicate indices are summed, within and across ranks). Here each rank packs its
coalesced tensor into one byte string (a header describing it, the indices, the values) and
one ``allgatherv`` moves them all: the counts travel inside that call, so nothing can slip in
between the two steps. Every rank parses every rank's header, so a rank whose tensor has a
different size, layout or dtype makes *every* rank raise the same error.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..errors import InvalidArgument

# dtypes a sparse tensor's values may have, by a stable code carried in the header
_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8,
           torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool, torch.complex64,
           torch.complex128]
_CODE = {dt: i for i, dt in enumerate(_DTYPES)}
_MAGIC = 0x5350415253455631   # "SPARSEV1"
_FIXED = 6                    # magic, nnz, sparse_dim, dense_dim, ndim, dtype code


def pack(t: torch.Tensor) -> np.ndarray:
    """Coalesce ``t`` (summing duplicate indices, as Gloo does first) and pack it as bytes.

    A dtype this cannot carry is still sent (as code -1, no data), so that every rank, not
    only this one, raises the same error in ``total``."""
    if t.dtype not in _CODE:
        header = np.array([_MAGIC, 0, t.sparse_dim(), t.dense_dim(), t.dim(), -1, *t.shape],
                          dtype=np.int64)
        return header.view(np.uint8)
    s = t.detach().to("cpu").coalesce()
    indices = s._indices().contiguous()
    values = s._values().contiguous()
    header = np.array([_MAGIC, s._nnz(), s.sparse_dim(), s.dense_dim(), s.dim(),
                       _CODE[t.dtype], *s.shape], dtype=np.int64)
    parts = [header.view(np.uint8), indices.numpy().reshape(-1).view(np.uint8),
             values.reshape(-1).view(torch.uint8).numpy()]
    return np.concatenate(parts)


def _header(blob: np.ndarray) -> tuple[int, int, tuple]:
    """(nnz, where the indices start, (sparse_dim, dense_dim, size, dtype)) of one blob."""
    magic, nnz, sparse_dim, dense_dim, ndim, code = (int(x) for x in blob[:8 * _FIXED]
                                                     .view(np.int64))
    shape = tuple(int(x) for x in blob[8 * _FIXED:8 * (_FIXED + ndim)].view(np.int64))
    dtype = _DTYPES[code] if magic == _MAGIC and 0 <= code < len(_DTYPES) else None
    return nnz, 8 * (_FIXED + ndim), (sparse_dim, dense_dim, shape, dtype)


def total(blobs: list[np.ndarray]) -> torch.Tensor:
    """The coalesced sum of every rank's packed tensor (rank order, like Gloo).

    Every rank's description is compared with rank 0's, so a disagreement raises the same
    error, naming the same rank, on every rank."""
    headers = [_header(blob) for blob in blobs]
    want = headers[0][2]
    for r, (_nnz, _at, meta) in enumerate(headers):
        if meta[3] is None:
            raise InvalidArgument(f"sparse all_reduce: rank {r}'s tensor has a dtype this "
                                  "backend cannot reduce sparsely; supported: "
                                  + ", ".join(str(d) for d in _DTYPES))
        if meta != want:
            raise InvalidArgument(
                f"sparse all_reduce: rank {r}'s tensor (sparse_dim, dense_dim, size, dtype) "
                f"{meta} differs from rank 0's {want}: every rank must pass a sparse tensor "
                "of the same size, layout and dtype")
    sparse_dim, _dense_dim, shape, dtype = want
    indices, values = [], []
    for blob, (nnz, at, _meta) in zip(blobs, headers):
        end = at + 8 * sparse_dim * nnz
        indices.append(torch.from_numpy(blob[at:end].copy().view(np.int64))
                       .reshape(sparse_dim, nnz))
        rows = (nnz,) + shape[sparse_dim:]
        raw = blob[end:]
        # an empty numpy slice becomes a tensor with stride 0, which .view(dtype) refuses
        values.append(torch.from_numpy(raw.copy()).view(dtype).reshape(rows) if raw.size
                      else torch.empty(rows, dtype=dtype))
    return torch.sparse_coo_tensor(torch.cat(indices, dim=1), torch.cat(values, dim=0), shape,
                                   dtype=dtype).coalesce()


def deliver(t: torch.Tensor, result: Any) -> None:
    """Replace ``t``'s contents with ``result`` (Gloo copies the sum into the input too)."""
    t.copy_(result.to(t.device))
