"""FastTucker completion's options: the run control it takes and its own knobs (see
:mod:`..common.options`)."""

from __future__ import annotations

from ..common.options import (
    ANY,
    COUNT,
    DEVICE,
    FLAG,
    FRACTION,
    NONNEGATIVE_COUNT,
    OPTIONAL_COUNT,
    OPTIONAL_POSITIVE,
    OPTIONAL_TOLERANCE,
    POSITIVE,
    TEXT,
    TOLERANCE,
    Option,
    choice,
    option_set,
    run_control,
    seed_option,
)

TUCKER_SGD = option_set(
    "tucker_sgd",
    run_control(
        "client",
        "scheduler",
        "partitions",
        "device",
        "out",
        "overwrite",
        "callback",
        "progress",
        device=DEVICE.replace(
            default="cpu", values=choice("cpu", "gpu", "auto"), help="where the partition tasks run their kernels"
        ),
    ),
    (
        Option(
            "test",
            None,
            TEXT,
            "Store | str | os.PathLike | None",
            "test entries: a store of the same shape, disjoint from the input (checked)",
            group="test",
        ),
        Option(
            "test_fraction",
            None,
            FRACTION,
            "float | None",
            "hold out this fraction of the input's entries as the test set, chosen by a hash of the "
            "coordinates and SEED (default 0.1 without TEST)",
            group="test",
        ),
        Option("epochs", 50, COUNT, "int", "epochs at most"),
        Option("batch", 64, COUNT, "int", "entries per batch of the factor pass (the GPU kernel takes batches of 16)"),
        Option(
            "step",
            "normalized",
            choice("normalized", "plain"),
            "str",
            "factor steps: 'normalized' divides a sample's moves by the squared norm of its gradient "
            "(normalized LMS), 'plain' is the seed's rule 14",
            details="To first order a normalized step removes the fraction LR_FACTORS of the sample's "
            "error, whatever the scale of the other modes' rows, so one rate suits every tensor.",
        ),
        Option(
            "lr_factors",
            None,
            OPTIONAL_POSITIVE,
            "float | None",
            "factor rate: the step fraction in (0, 2) of normalized steps (default 0.3), or the learning "
            "rate of plain steps (default 0.01)",
        ),
        Option(
            "lr_core",
            0.3,
            POSITIVE,
            "float",
            "learning rate of the core",
            details="Values are scaled to unit mean square for training, so the rates do not depend on "
            "the data's scale; an epoch whose training RMSE is not finite or grows 4-fold is redone at "
            "half the rates, at most 6 times.",
        ),
        Option(
            "lr_decay",
            None,
            OPTIONAL_TOLERANCE,
            "float | None",
            "rates of epoch t divided by 1 + LR_DECAY * t (default 0.05 with normalized steps, 0 with plain)",
        ),
        Option("reg_factors", 0.001, TOLERANCE, "float", "regularization of the factors"),
        Option("reg_core", 0.001, TOLERANCE, "float", "regularization of the core"),
        Option(
            "rebalance",
            True,
            FLAG,
            "bool",
            "reset the model's gauge after every epoch (orthonormal core-factor rows, columns of equal "
            "scale in every mode; same predictions)",
            flags=("--no-rebalance",),
        ),
        Option(
            "revive_epochs",
            10,
            NONNEGATIVE_COUNT,
            "int",
            "for this many first epochs, restart a component SGD has lost (strength under 5% of the "
            "median) as the best rank-1 fit of the training residual; 0: never",
        ),
        Option(
            "patience",
            5,
            OPTIONAL_COUNT,
            "int | None",
            "stop when the test RMSE has not improved for this many epochs (None: run all epochs)",
        ),
        seed_option("seed of the initial model, the batches and the split", default=0),
        Option(
            "threads",
            None,
            OPTIONAL_COUNT,
            "int | None",
            "numba threads per task (1: reproducible; default all)",
        ),
        Option(
            "init",
            "random",
            ANY,
            "str | FastTuckerResult",
            "'random' draws the initial model from SEED; a previous result (same ranks and core rank) "
            "continues training from its model",
            flags=None,
            spec=None,
        ),
    ),
)
