"""Child process for tests/test_image_atomic.py: write one image, slowly enough to be
killed part-way. Usage: python _image_writer_child.py PATH SEED MIB

Prints "ready" once its data is built, waits for a line on stdin, writes the image
(one thread, devices produced one at a time), then prints "done <image digest>".
"""

import sys

import numpy as np

from ipuos._image import DeviceSnapshot, write_image

KiB = 1024


def devices(seed: int, mib: int):
    rng = np.random.default_rng(seed)
    words = np.frombuffer(b"".join(rng.choice([b"tile ", b"sync ", b"exchange ", b"superstep ",
                                                b"littlefs ", b"\n", b"%d " % seed], 4096)), np.uint8)
    for t in range(mib * 4):  # 256 KiB devices: text-like, random and zero stretches
        def data(t=t):
            a = np.resize(words, 256 * KiB).copy()
            a[: 8 * KiB] = rng.integers(0, 256, 8 * KiB, dtype=np.uint8)
            if t % 5 == 0:
                a[128 * KiB :] = 0
            return a
        yield DeviceSnapshot(f"tile/{t}/disk", t, "/", 4096, 64, data)


def main():
    path, seed, mib = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    meta = {"preset": "test", "ipus": 1, "tiles_per_chip": mib * 4, "sram_per_tile": 256 * KiB}
    print("ready", flush=True)
    sys.stdin.readline()
    summary = write_image(path, meta, devices(seed, mib), threads=1, level=3, chunk_size=64 * KiB)
    print("done", summary["image_digest"], flush=True)


if __name__ == "__main__":
    main()
