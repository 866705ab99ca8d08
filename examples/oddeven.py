# Odd-even transposition sort across tiles: each tile keeps a sorted block; in phase p
# partners (i, i+1) with i of p's parity merge their blocks, the left keeps the low half.
import random

random.seed(__tileid)
block = sorted(random.randrange(10_000) for _ in range(8))
for phase in range(__numtiles):
    partner = __tileid + 1 if (__tileid + phase) % 2 == 0 else __tileid - 1
    if 0 <= partner < __numtiles:
        send(partner, block)
        sync()
        merged = sorted(block + recv(partner))
        block = merged[: len(block)] if __tileid < partner else merged[len(block):]
    else:
        sync()
result = gather(block, 0)
if __tileid == 0:
    flat = [x for part in result for x in part]
    print("sorted" if flat == sorted(flat) else "NOT SORTED", len(flat))
