"""TT-ALS's options: the run control it takes and its own knobs (see :mod:`..common.options`)."""

from __future__ import annotations

from ..common import options as O

TT_ALS = O.option_set(
    "tt_als",
    O.run_control(
        *O.CHECKPOINTED,
    ),
    (
        O.Option(
            "method",
            "exact",
            O.choice("exact", "randomized"),
            "str",
            "exact = each core's least-squares update contracted over every nonzero; randomized = "
            "rTT-ALS, each update solved from SAMPLES rows of its design drawn by their leverage scores "
            "(seed 000, chapter 5)",
            details="Draws are seeded per (run, sweep, update), so a resumed run draws what the "
            "uninterrupted one drew.",
            spec="algorithm",
        ),
        O.Option(
            "samples",
            65536,
            O.COUNT,
            "int",
            "randomized: design-matrix rows drawn per core update",
            metavar="J",
        ),
        O.Option(
            "warmup",
            1,
            O.NONNEGATIVE_COUNT,
            "int",
            "randomized: exact sweeps before the sketched ones (from random cores the leverage scores "
            "spread over fibers that hold no nonzero, so on a sparse tensor the sketched updates see "
            "almost none; an exact sweep moves the cores onto the nonzeros)",
            details="Their fits are evaluated (free for an exact sweep) and their history records carry "
            "``warmup`` True.",
            spec_added_later=True,
        ),
        O.Option(
            "fit_every",
            None,
            O.OPTIONAL_COUNT,
            "int | None",
            "randomized: evaluate the fit every K sweeps and at the last, those sweeps ending with an exact "
            "update (a pass over every nonzero) whose ||Y_j||^2 gives it (default every sweep up to 2^24 "
            "nonzeros, else every 5th)",
            details="It stops when the best of the last 3 evaluated fits does not beat the best before "
            "them by ``tol`` times that best; the exact method's fit is free and evaluated every sweep. "
            "A sweep whose fit is not evaluated is logged as such, its history record without ``fit`` "
            "(``fit_evaluated`` False).",
            metavar="K",
        ),
        O.Option(
            "max_sweeps",
            20,
            O.COUNT,
            "int",
            "sweeps at most, each left to right and back",
            flags=("--sweeps", "--max-sweeps"),
            metavar="N",
            spec="max_iters",
        ),
        O.Option(
            "tol",
            1e-5,
            O.TOLERANCE,
            "float",
            "stop when a sweep after the first changes the fit by less than TOL times the fit before it "
            "(|fit - fit_old| / |fit_old|)",
            details="Relative, not cp_als's absolute change: a train of a sparse count tensor may explain "
            "a millionth of it and still gain half its fit per sweep, which an absolute 1e-5 would stop. "
            "Both changes are in each sweep's history record (``fit_change``, ``fit_change_relative``).",
        ),
        O.Option(
            "init",
            "random",
            O.ANY,
            "str | Sequence[np.ndarray]",
            "initial cores: 'random' draws every core standard normal from SEED (core 0 first); or a "
            "sequence of (R_{k-1}, I_k, R_k) arrays",
            details="Random or given, the cores are then made right-orthonormal from the last to core 1, "
            "so core 0 carries the norm.",
            flags=None,
            spec=None,
        ),
        O.seed_option("seed of the random initial cores (standard normal)"),
    ),
    arguments=(
        O.argument(
            "ranks",
            O.RANKS,
            "int | Sequence[int]",
            "the N-1 inner TT ranks R_1..R_{N-1}, e.g. 8,8,8 for an order-4 tensor (one value: all of them); "
            "ranks[k] is at most min(I_0*..*I_k, I_{k+1}*..*I_{N-1})",
        ).replace(
            details="Each is also at most R_k I_k and I_{k+1} R_{k+2} (each core's unfolding keeps its "
            "rank); others raise DecompositionError (a ValueError) naming the rank."
        ),
    ),
)

# options of the randomized method only: giving one to the exact sweeps is an error at its own line
RANDOMIZED_ONLY = ("samples", "warmup", "fit_every")
