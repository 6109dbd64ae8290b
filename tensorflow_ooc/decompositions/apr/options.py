"""CP-APR's options: the run control it takes and its own knobs (see :mod:`..common.options`)."""

from __future__ import annotations

from ..common.options import (
    ANY,
    COUNT,
    DEVICE,
    FLAG,
    OPTIONAL_TOLERANCE,
    POSITIVE,
    TOLERANCE,
    Option,
    choice,
    option_set,
    run_control,
    seed_option,
)

ALGORITHMS = ("mu", "pdnr")

CP_APR = option_set(
    "cp_apr",
    run_control(
        "client",
        "scheduler",
        "execution",
        "partitions",
        "device",
        "device_options",
        "checkpoint",
        "resume",
        "checkpoint_every",
        "out",
        "overwrite",
        "callback",
        "distribution",
        device=DEVICE.replace(
            default="cpu",
            values=choice("cpu", "gpu"),
            help="gpu (mu only): each inner iteration's Phi runs on the cluster's GPU workers, streamed "
            "from the store; the log-likelihood pass and the updates run on the same workers' CPUs",
            spec_added_later=True,
        ),
    ),
    (
        Option(
            "algorithm",
            "mu",
            choice(*ALGORITHMS),
            "str",
            "mu = multiplicative updates (Chi & Kolda; cheap inner iterations), pdnr = projected damped "
            "Newton per row (Hansen, Plantenga & Kolda; fewer, costlier inner iterations)",
        ),
        Option("max_iters", 1000, COUNT, "int", "outer iterations at most"),
        Option("max_inner_iters", 10, COUNT, "int", "inner iterations per mode and outer iteration"),
        Option("tol", 1e-4, TOLERANCE, "float", "stop when every mode's KKT violation is below it"),
        Option(
            "init",
            "random",
            ANY,
            "str | Sequence[np.ndarray]",
            "initial factors: 'random' draws uniform [0, 1) factors from SEED (as pyttb); or a sequence "
            "of (I_n, R) nonnegative arrays",
            flags=None,
            spec=None,
        ),
        seed_option("seed of the random initial factors (uniform [0, 1))"),
        Option("kappa", 0.01, TOLERANCE, "float", "mu: offset that moves entries stuck at zero"),
        Option("kappa_tol", 1e-10, TOLERANCE, "float", "mu: an entry below it counts as zero"),
        Option(
            "eps_div_zero",
            None,
            OPTIONAL_TOLERANCE,
            "float | None",
            "floor of model values in divisions (default pyttb's 1e-10, or 1e-3 of the mean model value "
            "over all cells where that is smaller: huge hypersparse tensors)",
            details="A huge hypersparse tensor starts with model values far below 1e-10 at its nonzeros; "
            "floored there, the rows of B shrink until they underflow and the log-likelihood becomes -inf.",
        ),
        Option("eps_active", 1e-8, TOLERANCE, "float", "pdnr: active-set tolerance"),
        Option("mu0", 1e-5, POSITIVE, "float", "pdnr: initial damping"),
        Option(
            "inexact",
            True,
            FLAG,
            "bool",
            "pdnr: rows stop at max(tol, KKT violation / 100), 2 inner iterations in the first outer one",
        ),
    ),
)

# options of one algorithm only: giving one to the other is an error at its own line
FOR_ALGORITHM = {"kappa": "mu", "kappa_tol": "mu", "eps_active": "pdnr", "mu0": "pdnr", "inexact": "pdnr"}
