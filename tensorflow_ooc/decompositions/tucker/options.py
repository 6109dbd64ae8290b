"""Tucker HOOI's options: the run control it takes and its own knobs (see :mod:`..common.options`)."""

from __future__ import annotations

from ..common import options as O

# the TTM kernels (kernels.ttm.select.KERNELS, which loads numba; a test keeps the two equal)
TTM_KERNELS = ("coo", "csr", "fiber")

TUCKER_HOOI = O.option_set(
    "tucker_hooi",
    O.run_control(
        *O.CHECKPOINTED,
        "device",
        "progress",
        device=O.DEVICE.replace(
            default="cpu",
            values=O.choice("cpu", "gpu", "auto"),
            help="where partition tasks run: gpu = GPU workers, whose sparse TTMs run on the device "
            "(LocalCUDACluster when GPUs are visible and dask-cuda is installed); auto = GPUs when the "
            "cluster has them; the SVDs run on the workers' CPUs",
        ),
    ),
    (
        O.Option(
            "max_iters",
            50,
            O.COUNT,
            "int",
            "iterations at most",
            flags=("--max-iters", "--iters"),
        ),
        O.Option(
            "tol",
            1e-4,
            O.TOLERANCE,
            "float",
            "stop when the fit changes by less, the first iteration included, as pyttb",
        ),
        O.Option(
            "init",
            "random",
            O.ANY,
            "str | Sequence[np.ndarray | None]",
            "initial factors as pyttb: random = uniform [0, 1); nvecs = leading eigenvectors of "
            "X_(n) X_(n)^T (reads the nonzeros into memory)",
            details="Given factors: a sequence of (I_n, J_n) arrays, the first may be None (the first "
            "update computes it).",
            cli_choices=("random", "nvecs"),
            spec=None,  # a step's init (random, nvecs, previous, a result) is every decompose step's key
        ),
        O.seed_option("seed of the random initial factors and randomized SVDs"),
        O.Option(
            "svd",
            "auto",
            O.choice("auto", "gram", "randomized"),
            "str",
            "leading singular vectors by the Gram matrix's eigendecomposition or a randomized range "
            "finder (auto: gram when the smaller side of the non-empty unfolding is <= 2048)",
        ),
        O.Option(
            "kernel",
            None,
            O.choice(*TTM_KERNELS, optional=True),
            "str | None",
            "TTM kernel for every mode (default: the decision tree's O.choice per mode)",
            metavar="KERNEL",
        ),
    ),
    arguments=(
        O.argument(
            "ranks",
            O.RANKS,
            "int | Sequence[int]",
            "core size per mode, e.g. 8,8,8 (one value: every mode); each in 1..mode length",
        ),
    ),
)
