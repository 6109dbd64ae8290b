"""FastTucker completion's options: the run control it takes and its own knobs (see
:mod:`..common.options`)."""

from __future__ import annotations

from ..common import options as O

TUCKER_SGD = O.option_set(
    "tucker_sgd",
    O.run_control(
        "client",
        "scheduler",
        "partitions",
        "device",
        "out",
        "overwrite",
        "callback",
        "progress",
        device=O.DEVICE.replace(
            default="cpu", values=O.choice("cpu", "gpu", "auto"), help="where the partition tasks run their kernels"
        ),
    ),
    (
        O.Option(
            "test",
            None,
            O.TEXT,
            "Store | str | os.PathLike | None",
            "test entries: a store of the same shape, disjoint from the input (checked)",
            group="test",
        ),
        O.Option(
            "test_fraction",
            None,
            O.FRACTION,
            "float | None",
            "hold out this fraction of the input's entries as the test set, chosen by a hash of the "
            "coordinates and SEED (default 0.1 without TEST)",
            group="test",
        ),
        O.Option("epochs", 50, O.COUNT, "int", "epochs at most"),
        O.Option(
            "batch", 64, O.COUNT, "int", "entries per batch of the factor pass (the GPU kernel takes batches of 16)"
        ),
        O.Option(
            "step",
            "normalized",
            O.choice("normalized", "plain"),
            "str",
            "factor steps: 'normalized' divides a sample's moves by the squared norm of its gradient "
            "(normalized LMS), 'plain' is the seed's rule 14",
            details="To first order a normalized step removes the fraction LR_FACTORS of the sample's "
            "error, whatever the scale of the other modes' rows, so one rate suits every tensor.",
        ),
        O.Option(
            "lr_factors",
            None,
            O.OPTIONAL_POSITIVE,
            "float | None",
            "factor rate: the step fraction in (0, 2) of normalized steps (default 0.3), or the learning "
            "rate of plain steps (default 0.01)",
        ),
        O.Option(
            "lr_core",
            0.3,
            O.POSITIVE,
            "float",
            "learning rate of the core",
            details="Values are scaled to unit mean square for training, so the rates do not depend on "
            "the data's scale; an epoch whose training RMSE is not finite or grows 4-fold is redone at "
            "half the rates, at most 6 times.",
        ),
        O.Option(
            "lr_decay",
            None,
            O.OPTIONAL_TOLERANCE,
            "float | None",
            "rates of epoch t divided by 1 + LR_DECAY * t (default 0.05 with normalized steps, 0 with plain)",
        ),
        O.Option("reg_factors", 0.001, O.TOLERANCE, "float", "regularization of the factors"),
        O.Option("reg_core", 0.001, O.TOLERANCE, "float", "regularization of the core"),
        O.Option(
            "rebalance",
            True,
            O.FLAG,
            "bool",
            "reset the model's gauge after every epoch (orthonormal core-factor rows, columns of equal "
            "scale in every mode; same predictions)",
            flags=("--no-rebalance",),
        ),
        O.Option(
            "revive_epochs",
            10,
            O.NONNEGATIVE_COUNT,
            "int",
            "for this many first epochs, restart a component SGD has lost (strength under 5% of the "
            "median) as the best rank-1 fit of the training residual; 0: never",
        ),
        O.Option(
            "patience",
            5,
            O.OPTIONAL_COUNT,
            "int | None",
            "stop when the test RMSE has not improved for this many epochs (None: run all epochs)",
        ),
        O.seed_option("seed of the initial model, the batches and the split", default=0),
        O.Option(
            "threads",
            None,
            O.OPTIONAL_COUNT,
            "int | None",
            "numba threads per task (1: reproducible; default all)",
        ),
        O.Option(
            "init",
            "random",
            O.ANY,
            "str | FastTuckerResult",
            "'random' draws the initial model from SEED; a previous result (same ranks and core rank) "
            "continues training from its model",
            flags=None,
            spec=None,
        ),
    ),
    arguments=(
        O.argument("ranks", O.RANKS, "int | Sequence[int]", "factor ranks J_n, e.g. 8,8,8 (one value: every mode)"),
        O.argument("core_rank", O.COUNT, "int", "rank R of the Kruskal core"),
    ),
)
