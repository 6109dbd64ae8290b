"""CP-ALS's options: the run control it takes and its own knobs (see :mod:`..common.options`)."""

from __future__ import annotations

from ..common import options as O

METHODS = ("exact", "sts", "arls-lev", "arls-lev-hybrid")

CP_ALS = O.option_set(
    "cp_als",
    O.run_control(
        *O.CHECKPOINTED,
        "device",
        "device_options",
        "distribution",
        "conflict",
        "streams",
        "device_memory_limit",
    ),
    (
        O.Option("max_iters", 50, O.COUNT, "int", "iterations at most"),
        O.Option("tol", 1e-5, O.TOLERANCE, "float", "stop when the fit changes by less"),
        O.Option(
            "init",
            "random",
            O.ANY,
            "str | Sequence[np.ndarray]",
            "initial factors: 'random' draws uniform [0, 1) factors from SEED; or a sequence of (I_n, R) arrays",
            flags=None,
            spec=None,  # a step's init (random, previous, a result) is every decompose step's key
        ),
        O.seed_option("seed of the random initial factors"),
        O.Option("dtype", "float64", O.choice("float64", "float32"), "str", "factor precision"),
        O.Option(
            "method",
            "exact",
            O.choice(*METHODS),
            "str",
            "least-squares solves: exact (full MTTKRP), or randomized by sampling rows of the Khatri-Rao "
            "product: sts = exact leverage scores (STS-CP), arls-lev = product of the factors' leverage "
            "scores (CP-ARLS-LEV), arls-lev-hybrid = the same with rows of probability >= 1/SAMPLES taken "
            "deterministically",
            details="The sampled right-hand side needs only the nonzeros of the sampled fibers. "
            "Randomized methods run on CPU workers; dense inputs take 'exact' only.",
            # 'cp' is CP-ALS itself in a spec, whose method also names the other families
            spec_choices=("cp", *METHODS),
            spec_default="cp",
        ),
        O.Option(
            "samples",
            65536,
            O.COUNT,
            "int",
            "randomized methods: Khatri-Rao rows drawn per mode and iteration",
        ),
        O.Option(
            "warmup",
            1,
            O.NONNEGATIVE_COUNT,
            "int",
            "randomized methods: exact iterations before the sampled ones (random factors spread the "
            "leverage scores over rows that hold no nonzero, so on a sparse tensor almost no sampled "
            "fiber holds one; an exact iteration zeroes those rows)",
            spec_added_later=True,
        ),
        O.Option(
            "fit_sample",
            65536,
            O.NONNEGATIVE_COUNT,
            "int",
            "randomized methods: nonzeros sampled once per run for an estimated fit (with its standard "
            "error) of the rounds whose exact fit is not evaluated (0: none)",
            details="The exact fit is a full pass over the nonzeros; the estimate evaluates the model at "
            "the sample only. Stopping still uses the exact fits.",
            spec_added_later=True,
        ),
        O.Option(
            "fit_every",
            None,
            O.OPTIONAL_COUNT,
            "int | None",
            "randomized methods: evaluate the fit (one exact MTTKRP) every N iterations and at the last "
            "(default 1 up to 2^24 nonzeros, else 5)",
            details="They stop when the best fit of the last 3 evaluations improves on the best before "
            "by less than ``tol``.",
        ),
        O.Option(
            "nonnegative",
            False,
            O.FLAG,
            "bool",
            "nonnegative CP: every factor >= 0, each mode solved by HALS (hierarchical ALS, column by "
            "column on the normal equations, as TensorLy's non_negative_parafac_hals) instead of the "
            "least-squares solve; method exact only",
            spec_added_later=True,
        ),
        O.Option(
            "reg",
            0.0,
            O.TOLERANCE,
            "float",
            "with nonnegative: L2 (ridge) regularization REG >= 0 added to the diagonal of each HALS "
            "update's normal equations, shrinking the factors (0: none)",
            details="TensorLy's ``ridge_coefficient`` is ``reg / 2``.",
            spec_added_later=True,
        ),
    ),
    arguments=(O.argument("rank", O.COUNT, "int", "number of components R"),),
)
