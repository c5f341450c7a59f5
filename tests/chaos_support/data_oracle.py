"""The data-plan oracle: the committed steps' samples, in stream order, are the dataset
once per epoch. Pure: a function of the stream (`Ledger.data_stream`) and the size."""

from __future__ import annotations

__all__ = ["check_stream"]


def check_stream(stream: list[int], size: int) -> list[str]:
    """Why `stream` is not every index of range(`size`) once per epoch (an epoch is
    `size` consecutive samples; the last, unfinished one must hold none twice)."""
    epochs = len(stream) // size
    for e in range(epochs):
        chunk = stream[e * size : (e + 1) * size]
        if sorted(chunk) != list(range(size)):
            missing = sorted(set(range(size)) - set(chunk))
            twice = sorted({i for i in chunk if chunk.count(i) > 1})
            return [
                f"data: epoch {e} of the committed steps' samples is not the dataset once: "
                f"missing {missing[:10]}, twice {twice[:10]}"
            ]
    tail = stream[epochs * size :]
    if len(tail) != len(set(tail)):
        return [f"data: the unfinished epoch {epochs} used a sample twice"]
    return []
