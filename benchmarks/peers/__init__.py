"""Peers measured beside tensorflow_ooc, one module per peer.

In-process peers (imported): :mod:`.genten` (GenTen's ``pygenten`` wheel) and :mod:`.pyttb_peer`.
External peers (run as executables the user builds outside this repository and passes by path):
:mod:`.alto` and :mod:`.splatt`. :mod:`.common` holds what they share; :mod:`.verify` checks the
in-process peers against NumPy (``python benchmarks/peers``).
"""

from .common import FACTOR_SEED, numpy_mttkrp, random_factors
from .genten import GENTEN_ALL_METHODS, GENTEN_CP_ALS_METHODS, GENTEN_MODE_METHODS, genten_cp_als, genten_mttkrp
from .pyttb_peer import pyttb_cp_als, pyttb_mttkrp
from .verify import FIT_TOL, verify, verify_cp_als

__all__ = [
    "FACTOR_SEED",
    "FIT_TOL",
    "GENTEN_ALL_METHODS",
    "GENTEN_CP_ALS_METHODS",
    "GENTEN_MODE_METHODS",
    "genten_cp_als",
    "genten_mttkrp",
    "numpy_mttkrp",
    "pyttb_cp_als",
    "pyttb_mttkrp",
    "random_factors",
    "verify",
    "verify_cp_als",
]
