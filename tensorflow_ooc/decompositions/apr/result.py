"""CP-APR results: ``PoissonResult``, a nonnegative CP model of count data with its log-likelihood."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import numpy as np

from ..common.cp_result import CPResult


@dataclass
class PoissonResult(CPResult):
    """A nonnegative rank-R CP model of count data, ``sum_r weights[r] a_1[:, r] o ... o a_N[:, r]``,
    fitted by Poisson maximum likelihood (:func:`~tensorflow_ooc.decompositions.apr.cp_apr.cp_apr`).

    Factors have columns of unit 1-norm (each a distribution over its mode's indices; the weight is
    the component's expected total count) and components are sorted by weight. Besides
    :class:`CPResult`'s attributes (``fit`` is the least-squares fit, for comparison with CP-ALS):

    Attributes
    ----------
    loglik : float  Poisson log-likelihood ``sum_i x_i log m_i - m_i`` (pyttb's ``tt_loglikelihood``)
    kkt : float     KKT violation of the last outer iteration
    """

    loglik: float = float("nan")
    kkt: float = float("nan")

    @classmethod
    def arranged(cls, weights, factors, loglik, kkt, fit, iterations, history, params, input_fp) -> "PoissonResult":
        """Columns scaled to unit 1-norm (norms into the weights), components by decreasing weight."""
        w = np.array(weights, dtype=np.float64, copy=True)
        out = []
        for f in factors:
            norms = np.abs(f).sum(axis=0)
            w = w * norms
            out.append(f / np.where(norms == 0, 1, norms))
        order = np.argsort(-w, kind="stable")
        return cls(
            w[order], [f[:, order] for f in out], fit, iterations, history, params, input_fp, float(loglik), float(kkt)
        )

    def save_npz(self, path: str | os.PathLike) -> None:
        np.savez(
            path,
            **self.to_numpy(),
            history=json.dumps(self.history),
            fit=self.fit,
            loglik=self.loglik,
            kkt=self.kkt,
        )
