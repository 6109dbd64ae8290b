# Written with tensorflow_ooc at c150c2a (format version 1) to test that later versions read them.

import numpy as np

from tensorflow_ooc.ingest.convert import convert

rng = np.random.default_rng(20261126)


def make(name, shape, nnz, compression, chunk_nnz):
    coords = np.stack([rng.integers(0, s, nnz) for s in shape], axis=1)
    coords = np.unique(coords, axis=0)
    rng.shuffle(coords)
    vals = rng.standard_normal(coords.shape[0])
    np.savez(f"tests/data/{name}.npz", coords=coords, values=vals)
    convert(
        (coords, vals),
        f"tests/data/{name}.zarr",
        shape=shape,
        chunk_nnz=chunk_nnz,
        compression=compression,
        max_block_nnz=700,
        one_based=False,
    )


make("v1_fast_4d", (61, 24, 300, 517), 3000, "fast", 1024)
make("v1_none_5d_blocks", (1 << 20, 1 << 20, 1 << 20, 900, 7), 2500, "none", 1024)
