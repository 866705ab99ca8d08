"""Splitting a host data file into one share per tile (``__tiledata``).

Shares are cut on line boundaries, never mid-word, and are as even in bytes as lines
allow: tile i gets the lines that start in [i*size/n, (i+1)*size/n). With fewer lines
than tiles some shares are empty.
"""

from __future__ import annotations


def split_lines(data: bytes, ntiles: int) -> list[bytes]:
    if ntiles < 1:
        raise ValueError("need at least one tile to split data over")
    size = len(data)
    cuts = [0]
    for i in range(1, ntiles):
        # the first byte at or past i*size/n: rounded up, or a line starting just below
        # it would go to tile i instead of tile i-1
        target = max(-(-i * size // ntiles), cuts[-1])
        if target >= size:
            cut = size
        elif target == 0 or data[target - 1 : target] == b"\n":
            cut = target  # already at a line start
        else:
            newline = data.find(b"\n", target)
            cut = size if newline < 0 else newline + 1
        cuts.append(cut)
    cuts.append(size)
    return [data[cuts[i] : cuts[i + 1]] for i in range(ntiles)]


def decode_shares(shares: list[bytes], source: str = "the data file") -> list[str]:
    """The shares as text; ValueError naming the first bad byte's offset in the whole
    data (not in its share) if it is not UTF-8."""
    texts = []
    start = 0
    for share in shares:
        try:
            texts.append(share.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise ValueError(f"{source} is not UTF-8 text (byte {start + exc.start}: {exc.reason}); "
                             "__tiledata must be text") from None
        start += len(share)
    return texts
