# Monte Carlo estimate of pi: every tile throws darts, allreduce adds up the hits.
import random

random.seed(1000 + __tileid)
throws = 20_000
hits = sum(1 for _ in range(throws) if random.random() ** 2 + random.random() ** 2 < 1.0)
total = allreduce(hits, "sum")
if __tileid == 0:
    print(f"pi ~ {4 * total / (throws * __numtiles):.4f}")
