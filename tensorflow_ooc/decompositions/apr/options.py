"""CP-APR's options: the run control it takes and its own knobs (see :mod:`..common.options`)."""

from __future__ import annotations

from ..common import options as O

ALGORITHMS = ("mu", "pdnr")

CP_APR = O.option_set(
    "cp_apr",
    O.run_control(
        *O.CHECKPOINTED,
        "device",
        "device_options",
        "distribution",
        device=O.DEVICE.replace(
            default="cpu",
            values=O.choice("cpu", "gpu"),
            help="gpu (mu only): each inner iteration's Phi runs on the cluster's GPU workers, streamed "
            "from the store; the log-likelihood pass and the updates run on the same workers' CPUs",
            spec_added_later=True,
        ),
    ),
    (
        O.Option(
            "algorithm",
            "mu",
            O.choice(*ALGORITHMS),
            "str",
            "mu = multiplicative updates (Chi & Kolda; cheap inner iterations), pdnr = projected damped "
            "Newton per row (Hansen, Plantenga & Kolda; fewer, costlier inner iterations)",
        ),
        O.Option("max_iters", 1000, O.COUNT, "int", "outer iterations at most"),
        O.Option("max_inner_iters", 10, O.COUNT, "int", "inner iterations per mode and outer iteration"),
        O.Option("tol", 1e-4, O.TOLERANCE, "float", "stop when every mode's KKT violation is below it"),
        O.Option(
            "init",
            "random",
            O.ANY,
            "str | Sequence[np.ndarray]",
            "initial factors: 'random' draws uniform [0, 1) factors from SEED (as pyttb); or a sequence "
            "of (I_n, R) nonnegative arrays",
            flags=None,
            spec=None,
        ),
        O.seed_option("seed of the random initial factors (uniform [0, 1))"),
        O.Option("kappa", 0.01, O.TOLERANCE, "float", "mu: offset that moves entries stuck at zero"),
        O.Option("kappa_tol", 1e-10, O.TOLERANCE, "float", "mu: an entry below it counts as zero"),
        O.Option(
            "eps_div_zero",
            None,
            O.OPTIONAL_TOLERANCE,
            "float | None",
            "floor of model values in divisions (default pyttb's 1e-10, or 1e-3 of the mean model value "
            "over all cells where that is smaller: huge hypersparse tensors)",
            details="A huge hypersparse tensor starts with model values far below 1e-10 at its nonzeros; "
            "floored there, the rows of B shrink until they underflow and the log-likelihood becomes -inf.",
        ),
        O.Option("eps_active", 1e-8, O.TOLERANCE, "float", "pdnr: active-set tolerance"),
        O.Option("mu0", 1e-5, O.POSITIVE, "float", "pdnr: initial damping"),
        O.Option(
            "inexact",
            True,
            O.FLAG,
            "bool",
            "pdnr: rows stop at max(tol, KKT violation / 100), 2 inner iterations in the first outer one",
        ),
    ),
    arguments=(O.argument("rank", O.COUNT, "int", "number of components R"),),
)

# options of one algorithm only: giving one to the other is an error at its own line
FOR_ALGORITHM = {"kappa": "mu", "kappa_tol": "mu", "eps_active": "pdnr", "mu0": "pdnr", "inexact": "pdnr"}
