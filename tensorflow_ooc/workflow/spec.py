"""Workflow specs: a YAML file, safe-loaded, validated by pydantic models.

A spec names a storage root, a cluster and a set of steps::

    name: quickstart
    cluster: embedded              # embedded | gpu | a scheduler address (tcp://host:8786)
    storage: storage               # optional: the storage root (local folder or fsspec URL)
    steps:
      generate: {kind: generate, out: quickstart.tns, like: uber, model: planted, rank: 16}
      convert:  {kind: convert, input: quickstart.tns, out: quickstart.zarr}
      decompose: {kind: decompose, input: quickstart.zarr, out: quickstart.cp.zarr, rank: 16}

YAML is read with PyYAML's safe loader (no tags that construct Python objects, so no code runs).
Errors name the spec file, the line and the dotted field and say what was expected; unknown keys
are errors. After the models, :func:`load_spec` checks the workflow as a whole: every path inside
the storage root or a folder the operator allows (symbolic links resolved; a spec's own
``allow_paths`` can only narrow what the operator allows), step references, one writer per
output, inputs that exist or are made by a step, and no dependency cycles. A spec that passes starts nothing
by itself: :mod:`tensorflow_ooc.workflow.runner` runs it.
"""

from __future__ import annotations

import fnmatch
import hashlib
import importlib.util
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Literal, Union

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from ..limits import MAX_COUNT
from . import locations as loc
from .errors import Problem, SpecError

SPEC_VERSION = 1
STEP_KINDS = ("generate", "convert", "decompose", "evaluate", "export", "predict")
DECOMPOSE_METHODS = ("cp", "tucker", "completion", "cp-apr", "tt")
# methods whose results are CP models (weights and factors): pyttb exports, factor match scores
CP_RESULT_METHODS = ("cp", "cp-apr")
PRESET_NAMES = ("uber", "nips", "chicago", "nell2", "vast", "hypersparse", "amazon")
EXPORT_FORMATS = ("npz", "pyttb", "tensorly", "zarr")
# an export format and the package it needs (checked before anything starts)
EXPORT_NEEDS = {"pyttb": "pyttb", "tensorly": "tensorly"}
_STEP_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
_ADDRESS = re.compile(r"^(tcp|tls|inproc|ucx|ws|wss)://\S+$")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)
_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "kib": 2**10,
    "m": 10**6,
    "mb": 10**6,
    "mib": 2**20,
    "g": 10**9,
    "gb": 10**9,
    "gib": 2**30,
    "t": 10**12,
    "tb": 10**12,
    "tib": 2**40,
}


def parse_size(value: int | str) -> int:
    """``512MB``, ``2GiB`` or a byte count -> bytes."""
    if isinstance(value, int):
        if value < 1:
            raise ValueError(f"expected a positive size, got {value}")
        return value
    m = _SIZE.match(str(value))
    if not m or (m.group(2) or "").lower() not in _UNITS:
        raise ValueError(f"expected a size such as 512MB, 2GiB or 1000000, got {value!r}")
    return int(float(m.group(1)) * _UNITS[(m.group(2) or "").lower()])


# --- models ---------------------------------------------------------------------------------------


class _Model(BaseModel):
    # strict: YAML already types its scalars, so "16" stays a string and rank: "16" is an error
    # rather than a silent conversion; unknown keys are errors
    model_config = ConfigDict(extra="forbid", strict=True)


PositiveInt = Annotated[int, Field(ge=1, le=MAX_COUNT)]
Size = Union[int, str]


class _Step(_Model):
    after: list[str] = Field(
        default_factory=list,
        description="steps that must finish first (besides "
        "those whose outputs this step reads, which are found by path)",
    )
    description: str = ""
    retries: Annotated[int, Field(ge=0, le=100)] = Field(
        0,
        description="run the step again this many times when it fails transiently (not for bad input, "
        "a failed evaluation or a cancel)",
    )
    retry_delay: Annotated[float, Field(ge=0, le=3600, allow_inf_nan=False)] = Field(
        10.0, description="seconds before the first retry; each further retry waits twice as long"
    )

    def input_fields(self) -> dict[str, str]:
        """Role -> raw location of what this step reads."""
        return {}

    def output_fields(self) -> dict[str, str]:
        """Role -> raw location of what this step writes."""
        return {"out": self.out}

    def fingerprint_settings(self, config: dict) -> dict:
        """The settings that enter the step's fingerprint, from its dumped ``config``."""
        return config


class GenerateStep(_Step):
    """Write a synthetic tensor (``.tns``, ``.tns.gz`` or a store): heavy-tailed random values, a
    planted rank-``rank`` CP model on a heavy-tailed support with relative ``noise``, or
    (``planted-poisson``) counts drawn from a planted rank-``rank`` Poisson CP model, about ``nnz``
    of them nonzero (:class:`~tensorflow_ooc.synthetic.PlantedPoissonGenerator`, as ``tfooc generate
    --kind planted-poisson``), for CP-APR. Planted models write their true model to ``factors_out``."""

    kind: Literal["generate"]
    out: str
    like: Literal[PRESET_NAMES] | None = None  # type: ignore[valid-type]
    shape: list[PositiveInt] | None = None
    nnz: PositiveInt | None = None
    model: Literal["heavy-tailed", "planted", "planted-poisson"] = "heavy-tailed"
    rank: PositiveInt = 8
    noise: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 0.0
    skew: float | list[float] | None = None
    values: Literal["uniform", "count", "normal"] = "uniform"
    seed: Annotated[int, Field(ge=0)] = 0
    zero_based: bool = False
    factors_out: str | None = Field(
        None,
        description="planted, planted-poisson: where the true model goes (default OUT without its extension + "
        ".factors.npz)",
    )
    concentration: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = Field(
        None,
        description="planted-poisson: gamma shape of the factor entries (default 0.5; below 1 each column has a "
        "few large entries and many near 0, so components are distinct)",
    )
    _added_later: ClassVar[tuple[str, ...]] = ("concentration",)

    @model_validator(mode="after")
    def _size_given(self) -> GenerateStep:
        if self.like is None and (self.shape is None or self.nnz is None):
            raise ValueError("give 'like' (a preset) or both 'shape' and 'nnz'")
        if not self.planted and self.factors_out is not None:
            raise ValueError("'factors_out' is only for model: planted or planted-poisson")
        return self

    @field_validator("noise", "values", "concentration")
    @classmethod
    def _for_model(cls, v: Any, info: ValidationInfo) -> Any:
        # field validators run for given keys only, after 'model' (declared first): the problem
        # then names the key and its line
        model = info.data.get("model")
        if model is None:
            return v
        if info.field_name == "concentration" and model != "planted-poisson":
            raise ValueError("'concentration' is only for model: planted-poisson")
        if model == "planted-poisson":
            if info.field_name == "noise" and v:
                raise ValueError("'noise' does not apply to model: planted-poisson (its counts are Poisson draws)")
            if info.field_name == "values" and v != "count":
                raise ValueError(f"values: {v} does not apply to model: planted-poisson (its values are counts)")
        return v

    @property
    def planted(self) -> bool:
        """Whether a true model is written beside the tensor."""
        return self.model in ("planted", "planted-poisson")

    def factors_location(self) -> str | None:
        if not self.planted:
            return None
        if self.factors_out:
            return self.factors_out
        o = self.out
        stem = o[:-7] if o.endswith(".tns.gz") else o[:-4] if o.endswith(".tns") else o.rstrip("/")
        stem = stem.removesuffix(".zarr")
        return stem + ".factors.npz"

    def output_fields(self) -> dict[str, str]:
        out = {"out": self.out}
        if self.planted:
            out["factors_out"] = self.factors_location() or ""
        return out


class ConvertStep(_Step):
    """Convert ``.tns`` files into a BLCO store: one file, a glob, or a folder (``*.tns``,
    ``*.tns.gz``). With ``append: true`` the output is a versioned store: each run adds the files
    whose content was not ingested before (sha256 of the bytes, whatever the file's time or name)
    to the latest version's nonzeros and writes the next version. A file whose content changed
    under a name already ingested is an error unless ``on_changed`` says otherwise: ``append``
    adds its new content as new data (the old content stays), ``replace-version`` rebuilds the
    next version from every ingested file as it is now (the changed file's new content instead
    of its old; each other ingested content must still be there, under any name)."""

    kind: Literal["convert"]
    input: str
    out: str
    append: bool = False
    keep_versions: PositiveInt | None = None
    on_changed: Literal["error", "replace-version", "append"] = "error"
    shape: list[PositiveInt] | None = None
    zero_based: bool = False
    duplicates: Literal["error", "sum", "last"] = "error"
    chunk_nnz: PositiveInt | None = None
    max_block_nnz: PositiveInt | None = None
    compression: Literal["fast", "small", "none"] = "fast"
    values_dtype: Literal["float64", "float32"] | None = None
    memory_limit: Size | None = None
    _added_later: ClassVar[tuple[str, ...]] = ("values_dtype",)

    @field_validator("memory_limit")
    @classmethod
    def _size(cls, v: Size | None) -> Size | None:
        return None if v is None else parse_size(v)

    @model_validator(mode="after")
    def _versions(self) -> ConvertStep:
        if self.keep_versions is not None and not self.append:
            raise ValueError("'keep_versions' is only for append: true")
        if "on_changed" in self.model_fields_set and not self.append:
            raise ValueError("'on_changed' is only for append: true")
        return self

    def input_fields(self) -> dict[str, str]:
        return {"input": self.input}


class _Decompose(_Step):
    """What every decomposition step shares: its input, its result store, the seed, the warm
    start and where it runs."""

    kind: Literal["decompose"]
    input: str = Field(
        description="a BLCO store or a versioned store folder (its latest version); method cp also takes a "
        "dense Zarr array"
    )
    out: str = Field(description="the result store")
    seed: Annotated[int, Field(ge=0)] | None = 0
    init: str = Field(
        "random",
        description="random; previous (warm start from 'previous', default 'out' as the last run left it); "
        "or a result store path",
    )
    previous: str | None = None
    partitions: PositiveInt | None = None
    scheduler: Literal["auto", "inline", "cluster"] = Field(
        "auto",
        description="auto: in the driver for tensors of at most 2^24 nonzeros, on the cluster above; "
        "inline: always in the driver; cluster: always as Dask graphs on the cluster",
    )
    _inits: ClassVar[tuple[str, ...]] = ("random", "previous")

    @model_validator(mode="after")
    def _previous(self) -> _Decompose:
        if self.previous is not None and self.init != "previous":
            raise ValueError("'previous' is only used with init: previous")
        return self

    @property
    def method_name(self) -> str:
        """``cp``, ``tucker``, ``completion``, ``cp-apr`` or ``tt``."""
        return "cp"

    def warm_start_location(self) -> str | None:
        """Where the warm start is read, or None for an initialization the method computes."""
        if self.init in self._inits and self.init != "previous":
            return None
        if self.init == "previous":
            return self.previous or self.out
        return self.init

    def input_fields(self) -> dict[str, str]:
        out = {"input": self.input}
        # a warm start from an explicit result is an input; the previous result at 'out' is not
        # (it is this step's own output, read before it is replaced)
        if self.init not in self._inits:
            out["init"] = self.init
        elif self.init == "previous" and self.previous and self.previous != self.out:
            out["previous"] = self.previous
        return out


class DecomposeStep(_Decompose):
    """Rank-``rank`` CP-ALS of a store or a dense Zarr array (:func:`tensorflow_ooc.cp_als` with its
    options); ``method: cp`` (the default) or one of CP-ALS's solvers.

    ``init: previous`` warm-starts from the previous result (``previous``, default ``out`` as the
    last run left it); rows that a growing mode gained since are initialized at random at the
    scale of the existing rows. ``init`` may also name a result store.

    ``nonnegative: true`` runs nonnegative CP-ALS (HALS mode updates, every factor >= 0) with
    ``reg``, its L2 regularization; both enter the fingerprint only when set away from their
    defaults, so specs written before them keep theirs.
    """

    method: Literal["cp", "exact", "sts", "arls-lev", "arls-lev-hybrid"] = Field(
        "cp",
        description="cp (the default: CP-ALS), tucker (Tucker HOOI), completion (FastTucker tensor "
        "completion); for CP also its least-squares solver: exact (= cp), or randomized solves from "
        "sampled Khatri-Rao rows: sts (exact leverage scores), arls-lev, arls-lev-hybrid",
    )
    rank: PositiveInt
    max_iters: PositiveInt = 50
    tol: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 1e-5
    dtype: Literal["float64", "float32"] = "float64"
    execution: Literal["auto", "streaming", "in-memory"] = "auto"
    device: Literal["auto", "cpu", "gpu"] | None = None
    conflict: Literal["auto", "hierarchical", "register"] = "auto"
    streams: PositiveInt = 8
    device_memory_limit: Size | None = None
    checkpoint_every: PositiveInt = 1
    samples: PositiveInt = Field(65536, description="randomized methods: rows drawn per mode and iteration")
    fit_every: PositiveInt | None = Field(
        None,
        description="randomized methods: evaluate the fit every N iterations (default 1 up to 2^24 nonzeros, else 5)",
    )
    nonnegative: bool = Field(
        False,
        description="nonnegative CP-ALS: every factor >= 0, each mode solved by HALS (hierarchical ALS) on the "
        "normal equations; method cp (exact) only",
    )
    reg: Annotated[float, Field(ge=0, allow_inf_nan=False)] = Field(
        0.0,
        description="with nonnegative: L2 (ridge) regularization added to the diagonal of each HALS update's "
        "normal equations, shrinking the factors (0: none)",
    )
    _added_later: ClassVar[tuple[str, ...]] = ("nonnegative", "reg")

    @model_validator(mode="after")
    def _nonnegative(self) -> DecomposeStep:
        if self.reg > 0 and not self.nonnegative:
            raise ValueError("'reg' regularizes nonnegative CP-ALS: set nonnegative: true (or drop reg)")
        if self.nonnegative and self.solver != "exact":
            raise ValueError(f"nonnegative: true takes method: cp (exact), not {self.method}")
        return self

    @field_validator("device_memory_limit")
    @classmethod
    def _size(cls, v: Size | None) -> Size | None:
        return None if v is None else parse_size(v)

    @property
    def solver(self) -> str:
        """CP-ALS's ``method``: ``exact`` or a randomized solver."""
        return "exact" if self.method == "cp" else self.method

    def fingerprint_settings(self, config: dict) -> dict:
        # 'cp' is CP-ALS's exact solver, which specs wrote as 'exact' (the default) before methods
        # other than CP existed: the same settings keep the same fingerprint
        return {**config, "method": self.solver}


class TuckerDecomposeStep(_Decompose):
    """Tucker HOOI of a store (:func:`tensorflow_ooc.tucker_hooi`, ``tfooc tucker``): core size
    ``ranks`` (one per mode, or one for every mode). ``init: previous`` (or a Tucker result)
    starts from that result's factors: rows a growing mode gained since are drawn at random at the
    scale of the old rows, a larger rank gets random columns, a smaller one keeps the leading ones."""

    method: Literal["tucker"]
    ranks: PositiveInt | list[PositiveInt] = Field(description="core size per mode, or one for every mode")
    max_iters: PositiveInt = 50
    tol: Annotated[float, Field(ge=0, allow_inf_nan=False)] = Field(
        1e-4, description="stop when the fit changes by less (pyttb's rule, its first iteration included)"
    )
    svd: Literal["auto", "gram", "randomized"] = "auto"
    kernel: Literal["coo", "csr", "fiber"] | None = None
    execution: Literal["auto", "streaming", "in-memory"] = "auto"
    device: Literal["auto", "cpu", "gpu"] | None = None
    checkpoint_every: PositiveInt = 1
    _inits: ClassVar[tuple[str, ...]] = ("random", "nvecs", "previous")

    @property
    def method_name(self) -> str:
        return "tucker"


class CompletionDecomposeStep(_Decompose):
    """FastTucker tensor completion of a store by FastTuckerPlus SGD (:func:`tensorflow_ooc.tucker_sgd`,
    ``tfooc complete``): factor ranks ``ranks``, Kruskal core rank ``core_rank``, tested every epoch
    on ``test`` (a store) or a seeded ``test_fraction`` of the input. ``init: previous`` (or a
    FastTucker result) continues training from that model: rows a growing mode gained since start
    at random at the scale of the old rows; other ranks than the previous model's start at random."""

    method: Literal["completion"]
    ranks: PositiveInt | list[PositiveInt] = Field(description="factor ranks J_n, one per mode or one for every mode")
    core_rank: PositiveInt = Field(description="rank R of the Kruskal core")
    test: str | None = Field(None, description="test entries: a store of the same shape, disjoint from the input")
    test_fraction: Annotated[float, Field(gt=0, lt=1, allow_inf_nan=False)] | None = Field(
        None, description="hold out this fraction of the input as the test set (default 0.1 without 'test')"
    )
    epochs: PositiveInt = 50
    batch: PositiveInt = 64
    step: Literal["normalized", "plain"] = "normalized"
    lr_factors: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    lr_core: Annotated[float, Field(gt=0, allow_inf_nan=False)] = 0.3
    lr_decay: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None
    reg_factors: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 0.001
    reg_core: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 0.001
    rebalance: bool = True
    revive_epochs: Annotated[int, Field(ge=0, le=MAX_COUNT)] = 10
    patience: PositiveInt | None = 5
    threads: PositiveInt | None = Field(None, description="numba threads per task (1: reproducible)")
    device: Literal["auto", "cpu", "gpu"] | None = None

    @model_validator(mode="after")
    def _test(self) -> CompletionDecomposeStep:
        if self.test is not None and self.test_fraction is not None:
            raise ValueError("give 'test' (a test store) or 'test_fraction', not both")
        return self

    @property
    def method_name(self) -> str:
        return "completion"

    def input_fields(self) -> dict[str, str]:
        out = super().input_fields()
        if self.test:
            out["test"] = self.test
        return out


class PoissonDecomposeStep(_Decompose):
    """CP-APR of a store of counts (:func:`tensorflow_ooc.cp_apr`, ``tfooc apr``): rank-``rank``
    nonnegative CP by Poisson maximum likelihood, by multiplicative updates (``algorithm: mu``) or
    row-wise projected damped Newton (``algorithm: pdnr``). ``init: previous`` (or a CP result:
    CP-APR's own, or CP-ALS's) starts from that model as a CP warm start does; CP-APR needs
    nonnegative factors, so a CP-ALS result's negative entries are taken by absolute value (the
    step logs how many). Checkpoints and resumes as CP-ALS does."""

    method: Literal["cp-apr"]
    rank: PositiveInt
    algorithm: Literal["mu", "pdnr"] = Field(
        "mu",
        description="mu: multiplicative updates (Chi & Kolda); pdnr: projected damped Newton per row (Hansen, "
        "Plantenga & Kolda)",
    )
    max_iters: PositiveInt = Field(1000, description="outer iterations at most")
    max_inner_iters: PositiveInt = Field(10, description="inner iterations per mode and outer iteration")
    tol: Annotated[float, Field(ge=0, allow_inf_nan=False)] = Field(
        1e-4, description="stop when every mode's KKT violation is below it"
    )
    kappa: Annotated[float, Field(ge=0, allow_inf_nan=False)] = Field(
        0.01, description="mu: offset that moves entries stuck at zero"
    )
    kappa_tol: Annotated[float, Field(ge=0, allow_inf_nan=False)] = Field(
        1e-10, description="mu: an entry below it counts as zero"
    )
    eps_div_zero: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = Field(
        None,
        description="floor of model values in divisions (default pyttb's 1e-10, or 1e-3 of the mean model "
        "value over all cells where that is smaller: huge hypersparse tensors)",
    )
    eps_active: Annotated[float, Field(ge=0, allow_inf_nan=False)] = Field(
        1e-8, description="pdnr: active-set tolerance"
    )
    mu0: Annotated[float, Field(gt=0, allow_inf_nan=False)] = Field(1e-5, description="pdnr: initial damping")
    inexact: bool = Field(
        True, description="pdnr: rows stop at max(tol, KKT violation / 100), 2 inner iterations in the first outer one"
    )
    execution: Literal["auto", "streaming", "in-memory"] = "auto"
    checkpoint_every: PositiveInt = 1

    @field_validator("kappa", "kappa_tol", "eps_active", "mu0", "inexact")
    @classmethod
    def _for_algorithm(cls, v: Any, info: ValidationInfo) -> Any:
        # run for given keys only, after 'algorithm' (declared first): an option of the other
        # algorithm is an error at its own line rather than a setting silently unused
        algorithm = info.data.get("algorithm")
        want = "mu" if info.field_name in ("kappa", "kappa_tol") else "pdnr"
        if algorithm is not None and algorithm != want:
            raise ValueError(
                f"{info.field_name!r} is only for algorithm: {want} (this step runs algorithm: {algorithm})"
            )
        return v

    @property
    def method_name(self) -> str:
        return "cp-apr"


class TTDecomposeStep(_Decompose):
    """Tensor-train ALS of a store (:func:`tensorflow_ooc.tt_als`, ``tfooc tt``): inner TT ranks
    ``ranks`` (``N - 1`` of them, or one for all), by exact sweeps or randomized rTT-ALS
    (``algorithm: randomized``: each core update solves a sketch of ``samples`` rows drawn by
    their leverage scores). ``init: previous`` (or a TT result) starts from that train's cores:
    slices a growing mode gained since are drawn at random at the scale of the core's old ones; a
    previous train of other ranks is not used (the step logs it and starts at random).
    Checkpoints and resumes as CP-ALS does."""

    method: Literal["tt"]
    ranks: PositiveInt | list[PositiveInt] = Field(
        description="inner TT ranks R_1 .. R_{N-1} (N - 1 of them), or one for all; each at most what the "
        "tensor's shape allows (checked when the step runs)"
    )
    algorithm: Literal["exact", "randomized"] = Field(
        "exact",
        description="exact: each core's least-squares update contracted over every nonzero; randomized: "
        "rTT-ALS, each update solved from 'samples' rows of its design drawn by their leverage scores",
    )
    max_iters: PositiveInt = Field(20, description="sweeps at most (tt_als's max_sweeps)")
    tol: Annotated[float, Field(ge=0, allow_inf_nan=False)] = Field(
        1e-5, description="stop when a sweep after the first changes the fit by less"
    )
    samples: PositiveInt = Field(65536, description="randomized: design rows drawn per core update")
    fit_every: PositiveInt | None = Field(
        None,
        description="randomized: evaluate the fit every N sweeps and at the last "
        "(default 1 up to 2^24 nonzeros, else 5)",
    )
    execution: Literal["auto", "streaming", "in-memory"] = "auto"
    checkpoint_every: PositiveInt = 1

    @field_validator("ranks", mode="before")
    @classmethod
    def _ranks(cls, v: Any) -> Any:
        # one problem naming the bad rank, rather than one per member of the union (int or list)
        def bad(r: Any) -> bool:
            return isinstance(r, bool) or not isinstance(r, int)

        if isinstance(v, list):
            if not v:
                raise ValueError("expected at least one rank")
            for k, r in enumerate(v):
                if bad(r):
                    raise ValueError(f"expected integers, got {r!r} at ranks[{k}]")
                if r < 1:
                    raise ValueError(f"ranks[{k}] is {r}; every TT rank must be >= 1")
        elif bad(v):
            raise ValueError(f"expected an integer or a list of integers (R_1 .. R_N-1), got {v!r}")
        elif v < 1:
            raise ValueError(f"every TT rank must be >= 1, got {v}")
        return v

    @field_validator("samples", "fit_every")
    @classmethod
    def _for_algorithm(cls, v: Any, info: ValidationInfo) -> Any:
        # run for given keys only, after 'algorithm' (declared first): an option the exact
        # sweeps do not use is an error at its own line rather than a setting silently unused
        algorithm = info.data.get("algorithm")
        if algorithm is not None and algorithm != "randomized":
            raise ValueError(
                f"{info.field_name!r} is only for algorithm: randomized (this step runs algorithm: {algorithm})"
            )
        return v

    @property
    def method_name(self) -> str:
        return "tt"


class EvaluateStep(_Step):
    """Fit of a result (CP, Tucker, FastTucker or tensor train) against a tensor (a store or a dense
    array) and its errors on the tensor's entries (a CP-APR result: also its Poisson log-likelihood), and a CP
    result's factor match score against a reference model; writes the metrics as JSON.
    ``min_fit`` / ``min_fms`` / ``max_rmse`` make the step fail beyond them."""

    kind: Literal["evaluate"]
    result: str
    tensor: str | None = None
    reference: str | None = None
    out: str | None = None
    min_fit: Annotated[float, Field(allow_inf_nan=False)] | None = None
    min_fms: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)] | None = None
    max_rmse: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = Field(
        None, description="fail above this RMSE on the tensor's entries (needs 'tensor')"
    )
    _added_later: ClassVar[tuple[str, ...]] = ("max_rmse",)

    @model_validator(mode="after")
    def _needs(self) -> EvaluateStep:
        if self.min_fms is not None and self.reference is None:
            raise ValueError("'min_fms' needs a 'reference'")
        if self.max_rmse is not None and self.tensor is None:
            raise ValueError("'max_rmse' needs a 'tensor'")
        return self

    def metrics_location(self) -> str:
        return self.out or self.result.rstrip("/") + ".evaluation.json"

    def input_fields(self) -> dict[str, str]:
        out = {"result": self.result}
        if self.tensor:
            out["tensor"] = self.tensor
        if self.reference:
            out["reference"] = self.reference
        return out

    def output_fields(self) -> dict[str, str]:
        return {"out": self.metrics_location()}


class ExportStep(_Step):
    """Publish a result: ``npz`` (its arrays: weights and factors, a Tucker core and factors, a
    FastTucker model's factors and core factors, or a tensor train's cores), ``pyttb`` (a CP result
    as ``pyttb.export_data`` text, read by ``pyttb.import_data``), ``tensorly`` (a pickled
    ``CPTensor``, ``TuckerTensor`` for Tucker and FastTucker results, ``TTTensor`` for a tensor
    train) or ``zarr`` (a result store)."""

    kind: Literal["export"]
    result: str
    format: Literal[EXPORT_FORMATS]  # type: ignore[valid-type]
    out: str

    def input_fields(self) -> dict[str, str]:
        return {"result": self.result}


class PredictStep(_Step):
    """A model's predicted values at a list of coordinates (what completion is for; CP, Tucker and
    tensor-train results predict too): ``coords`` is a ``.tns``/``.tns.gz`` file (N indices per line, with or
    without a value, which is ignored) or a store (the coordinates of its nonzeros); ``out`` is a
    ``.tns``/``.tns.gz`` file (each coordinate with its predicted value, in the order read) or an
    ``.npz`` (``coords`` 0-based, ``values``)."""

    kind: Literal["predict"]
    result: str = Field(description="a result store (CP, Tucker, FastTucker or tensor train) or a model .npz")
    coords: str = Field(description="a .tns/.tns.gz file of coordinates or a store")
    out: str = Field(description=".tns, .tns.gz or .npz")
    zero_based: bool = Field(False, description=".tns files in and out: indices from 0 (default from 1, as FROSTT)")

    @field_validator("out")
    @classmethod
    def _out(cls, v: str) -> str:
        if not v.endswith((".tns", ".tns.gz", ".npz")):
            raise ValueError(f"expected a .tns, .tns.gz or .npz file, got {v!r}")
        return v

    def input_fields(self) -> dict[str, str]:
        return {"result": self.result, "coords": self.coords}


# a decompose step's model is chosen by its 'method' (cp when absent or one of CP's solvers)
DECOMPOSE_MODELS: dict[str, type[_Decompose]] = {
    "decompose": DecomposeStep,
    "decompose-tucker": TuckerDecomposeStep,
    "decompose-completion": CompletionDecomposeStep,
    "decompose-cp-apr": PoissonDecomposeStep,
    "decompose-tt": TTDecomposeStep,
}
STEP_MODELS: dict[str, type[_Step]] = {
    "generate": GenerateStep,
    "convert": ConvertStep,
    "decompose": DecomposeStep,
    "evaluate": EvaluateStep,
    "export": ExportStep,
    "predict": PredictStep,
}
STEP_TAGS = (*STEP_MODELS, *DECOMPOSE_MODELS)
_METHOD_OF = {
    "decompose": "cp",
    "decompose-tucker": "tucker",
    "decompose-completion": "completion",
    "decompose-cp-apr": "cp-apr",
    "decompose-tt": "tt",
}


def _step_tag(value: Any) -> str | None:
    """The union member a step is validated as: its kind, and for decompose its method."""
    if isinstance(value, dict):
        kind = value.get("kind")
        if kind == "decompose" and value.get("method") in ("tucker", "completion", "cp-apr", "tt"):
            return f"decompose-{value['method']}"
        return kind if isinstance(kind, str) else None
    for tag, model in (*DECOMPOSE_MODELS.items(), *STEP_MODELS.items()):
        if type(value) is model:
            return tag
    return None


Step = Annotated[
    Union[
        Annotated[GenerateStep, Tag("generate")],
        Annotated[ConvertStep, Tag("convert")],
        Annotated[DecomposeStep, Tag("decompose")],
        Annotated[TuckerDecomposeStep, Tag("decompose-tucker")],
        Annotated[CompletionDecomposeStep, Tag("decompose-completion")],
        Annotated[PoissonDecomposeStep, Tag("decompose-cp-apr")],
        Annotated[TTDecomposeStep, Tag("decompose-tt")],
        Annotated[EvaluateStep, Tag("evaluate")],
        Annotated[ExportStep, Tag("export")],
        Annotated[PredictStep, Tag("predict")],
    ],
    Discriminator(_step_tag),
]


class Spec(_Model):
    """A workflow spec (see the module docstring and ``workflows/README.md``)."""

    version: Literal[1] = SPEC_VERSION
    name: str | None = None
    description: str = ""
    storage: str | None = None
    allow_paths: list[str] = Field(default_factory=list)
    cluster: str = "embedded"
    on_failure: str | list[str] | None = Field(
        None,
        description="a command run when the run fails, with TFOOC_RUN_ID, TFOOC_ERROR, TFOOC_STEP, "
        "TFOOC_WORKFLOW, TFOOC_STORAGE and TFOOC_EXIT_CODE in its environment: a string (run by "
        "/bin/sh) or a list (the program and its arguments); its own failure is logged, not fatal",
    )
    steps: dict[str, Step]

    @field_validator("on_failure")
    @classmethod
    def _on_failure(cls, v: str | list[str] | None) -> str | list[str] | None:
        if v is not None and (not v or (isinstance(v, str) and not v.strip())):
            raise ValueError("expected a command (a string, or a list of the program and its arguments)")
        return v

    @field_validator("cluster")
    @classmethod
    def _cluster(cls, v: str) -> str:
        if v in ("embedded", "gpu") or _ADDRESS.match(v):
            return v
        raise ValueError(f"expected 'embedded', 'gpu' or a scheduler address such as tcp://host:8786, got {v!r}")

    @field_validator("steps")
    @classmethod
    def _steps(cls, v: dict[str, Any]) -> dict[str, Any]:
        if not v:
            raise ValueError("expected at least one step")
        bad = [k for k in v if not _STEP_NAME.match(str(k))]
        if bad:
            raise ValueError(f"step names are letters, digits, '_', '.', '-'; got {bad[0]!r}")
        return v

    @field_validator("name")
    @classmethod
    def _name(cls, v: str | None) -> str | None:
        if v is not None and not _STEP_NAME.match(v):
            raise ValueError(f"expected letters, digits, '_', '.', '-', got {v!r}")
        return v


# --- loading with line numbers ---------------------------------------------------------------------


def _walk(node: yaml.Node, prefix: tuple, marks: dict[tuple, int], problems: list[Problem]) -> None:
    """Record the line of every key and list item; duplicate keys (which YAML would silently let
    the last one win) are problems."""
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for k, v in node.value:
            key = str(k.value) if isinstance(k, yaml.ScalarNode) else repr(k)
            line = k.start_mark.line + 1
            if key in seen:
                problems.append(
                    Problem(
                        line, ".".join(map(str, prefix + (key,))), f"duplicate key (first given on line {seen[key]})"
                    )
                )
            seen[key] = line
            marks[prefix + (key,)] = line
            _walk(v, prefix + (key,), marks, problems)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            marks[prefix + (i,)] = item.start_mark.line + 1
            _walk(item, prefix + (i,), marks, problems)


@dataclass
class Source:
    """The text of a spec, its data and the line of every key.

    ``data`` is what the steps run with: ``${VAR}`` references substituted and ``--set``
    overrides applied. ``overrides`` maps each dotted field set by ``--set`` to the option as
    given (so a problem with it names the option, not a line of the file), and ``resolved_text``
    is ``data`` as YAML when it differs from ``text`` (what a submitted driver and the run record
    get: the run is reproducible without the environment it was started from)."""

    path: str
    text: str
    data: Any
    marks: dict[tuple, int]
    overrides: dict[str, str] = field(default_factory=dict)
    resolved_text: str | None = None

    @property
    def effective_text(self) -> str:
        """The spec as it runs: ``resolved_text``, else the file's text."""
        return self.resolved_text if self.resolved_text is not None else self.text

    def annotate(self, problems: list[Problem]) -> list[Problem]:
        """``problems`` with those about a field set by ``--set`` pointing at the option instead of
        a line of the file (the value there is not the one that was checked)."""
        out = []
        for p in problems:
            where = next(
                (k for k in self.overrides if p.field and (p.field == k or p.field.startswith(k + "."))),
                None,
            )
            out.append(
                p if where is None else Problem(None, p.field, f"{p.message} (from --set {self.overrides[where]})")
            )
        return out

    def line(self, where: tuple) -> int:
        """Line of the deepest key of ``where`` that the file has (pydantic's union tags skipped)."""
        line, cur, node = 1, (), self.data
        for part in where:
            if isinstance(node, dict) and str(part) in {str(k) for k in node}:
                key = next(k for k in node if str(k) == str(part))
                cur, node = cur + (str(key),), node[key]
            elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
                cur, node = cur + (part,), node[part]
            else:
                continue
            line = self.marks.get(cur, line)
        return line


#: a spec is a page of settings: anything near these limits is a mistake or an attack
MAX_SPEC_CHARS = 1 << 20
MAX_SPEC_NODES = 100_000


def _check_expansion(root: yaml.Node) -> None:
    """Refuse aliases that expand past :data:`MAX_SPEC_NODES` (a 'billion laughs' document is a
    few hundred bytes whose aliases expand to 10^9 nodes: it exhausted memory while being built)."""
    sizes: dict[int, int] = {}
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if id(node) in sizes:
            continue
        kids = (
            [n for kv in node.value for n in kv]
            if isinstance(node, yaml.MappingNode)
            else list(node.value)
            if isinstance(node, yaml.SequenceNode)
            else []
        )
        if children_done:
            sizes[id(node)] = 1 + sum(sizes[id(k)] for k in kids)
            if sizes[id(node)] > MAX_SPEC_NODES:
                raise yaml.YAMLError(
                    f"its aliases expand to more than {MAX_SPEC_NODES:,} values (a YAML "
                    f"'billion laughs' document?); a workflow spec is far smaller"
                )
            continue
        stack.append((node, True))
        stack.extend((k, False) for k in kids if id(k) not in sizes)


def read_source(
    path: str | os.PathLike | None = None,
    text: str | None = None,
    *,
    overrides: Sequence[str] = (),
    environ: Mapping[str, str] | None = None,
    interpolate: bool = True,
) -> Source:
    """Read and safe-load a spec; YAML errors become a :class:`SpecError` with the line.

    ``${VAR}``, ``${VAR:-default}`` and ``${VAR-default}`` in values are replaced from ``environ``
    (default ``os.environ``; see :func:`interpolate_node`) unless ``interpolate`` is false (a text
    that was resolved already), then each ``overrides`` entry ``dotted.path=VALUE`` is applied
    (:func:`apply_override`)."""
    name = str(path) if path is not None else "<string>"
    if text is None:
        if path is None:
            raise ValueError("give a spec path or its text")
        try:
            if loc.is_url(str(path)):
                text = loc.read_text(str(path))
            else:
                with open(path, encoding="utf-8") as f:
                    text = f.read()
        except FileNotFoundError:
            raise SpecError(name, [Problem(None, None, "no such spec file")]) from None
        except (IsADirectoryError, UnicodeDecodeError) as exc:
            raise SpecError(name, [Problem(None, None, f"not a YAML text file ({exc})")]) from None
    if len(text) > MAX_SPEC_CHARS:
        raise SpecError(
            name,
            [Problem(None, None, f"the spec is {len(text):,} characters long; a spec is at most {MAX_SPEC_CHARS:,}")],
        )
    loader = None
    try:
        loader = yaml.SafeLoader(text)  # refuses control characters (a ReaderError) here already
        node = loader.get_single_node()
        changed = False
        if node is not None:
            _check_expansion(node)
            if interpolate:
                env_problems: list[Problem] = []
                changed = interpolate_node(node, loader, os.environ if environ is None else environ, env_problems)
                if env_problems:
                    raise SpecError(name, env_problems)
        data = loader.construct_document(node) if node is not None else None
    except RecursionError:
        raise SpecError(name, [Problem(None, None, "the YAML is nested too deeply to be a workflow spec")]) from None
    except yaml.MarkedYAMLError as exc:
        # the context mark is where the broken construct starts (an unclosed '[' or a key missing
        # its ':'); the problem mark is where the parser gave up, often the next line or the end
        mark = exc.context_mark or exc.problem_mark
        what = " ".join(s for s in (exc.context, exc.problem) if s)
        if exc.context_mark and exc.problem_mark and exc.problem_mark.line != exc.context_mark.line:
            what += f" (on line {exc.problem_mark.line + 1})"
        raise SpecError(
            name,
            [
                Problem(
                    mark.line + 1 if mark else None,
                    None,
                    f"YAML error: {what} (column {mark.column + 1 if mark else '?'})",
                )
            ],
        ) from None
    except yaml.YAMLError as exc:
        raise SpecError(name, [Problem(None, None, f"YAML error: {exc}")]) from None
    finally:
        if loader is not None:
            loader.dispose()
    if node is None:
        raise SpecError(name, [Problem(1, None, "the spec is empty (expected a mapping with 'steps')")])
    if not isinstance(data, dict):
        raise SpecError(
            name,
            [
                Problem(
                    node.start_mark.line + 1,
                    None,
                    f"expected a mapping with 'steps' at the top, got a {type(data).__name__}",
                )
            ],
        )
    marks: dict[tuple, int] = {(): 1}
    problems: list[Problem] = []
    _walk(node, (), marks, problems)
    if problems:
        raise SpecError(name, problems)
    src = Source(name, text, data, marks)
    for given in overrides:
        field_name = apply_override(data, given, name)
        src.overrides[field_name] = given
    if changed or overrides:
        what = ", ".join((["environment variables substituted"] if changed else []) + [f"--set {o}" for o in overrides])
        src.resolved_text = f"# {name}, resolved ({what})\n" + yaml.safe_dump(
            data, sort_keys=False, default_flow_style=False, allow_unicode=True
        )
    return src


# --- ${VAR} references and --set overrides ------------------------------------------------------------

# "$${" is a literal "${"; "${BODY}" a reference; a "${" left without its "}" is an error
_REFERENCE = re.compile(r"\$\$\{|\$\{([^}]*)\}|\$\{")
_REFERENCE_BODY = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(?:(:?-)(.*))?", re.DOTALL)


def interpolate_value(value: str, environ: Mapping[str, str]) -> tuple[str, list[str]]:
    """``value`` with its ``${VAR}`` references replaced, and what is wrong with them.

    ``${VAR}`` is the variable's value (an error when it is not set), ``${VAR:-default}`` the
    default when the variable is unset or empty, ``${VAR-default}`` the default only when it is
    unset, and ``$${`` a literal ``${`` (as Docker Compose reads them).

    Examples
    --------
    >>> interpolate_value("rank-${RANK:-16}/$${HOME}", {})
    ('rank-16/${HOME}', [])
    >>> interpolate_value("${STORE}", {})[1]
    ['environment variable STORE is not set (set it, or give a default: ${STORE:-DEFAULT})']
    """
    errors: list[str] = []

    def replace(m: re.Match) -> str:
        if m.group(0) == "$${":
            return "${"
        if m.group(1) is None:
            errors.append("'${' without its closing '}' (write $${ for a literal ${)")
            return m.group(0)
        ref = _REFERENCE_BODY.fullmatch(m.group(1))
        if ref is None:
            errors.append(
                f"{m.group(0)!r} is not a reference: expected ${{NAME}}, ${{NAME:-default}} or ${{NAME-default}}"
            )
            return m.group(0)
        var, op, default = ref.groups()
        got = environ.get(var)
        if op == ":-" and not got:
            got = default
        elif op == "-" and got is None:
            got = default
        if got is None:
            errors.append(f"environment variable {var} is not set (set it, or give a default: ${{{var}:-DEFAULT}})")
            return m.group(0)
        return got

    return _REFERENCE.sub(replace, value), errors


def interpolate_node(
    node: yaml.Node, loader: yaml.SafeLoader, environ: Mapping[str, str], problems: list[Problem]
) -> bool:
    """Replace ``${VAR}`` references (:func:`interpolate_value`) in the values of a composed YAML
    document, in place; return whether any value changed. Keys are left as they are.

    A plain (unquoted) value is typed again after the substitution, as YAML types what is written
    in the file: ``rank: ${RANK:-16}`` is the integer 16, ``tol: ${TOL}`` with ``TOL=1e-6`` a
    float. A quoted value stays a string. Each problem has the line and the dotted field."""
    changed = False
    seen: set[int] = set()  # an anchored node is visited once, however many aliases name it
    stack: list[tuple[yaml.Node, tuple]] = [(node, ())]
    while stack:
        n, where = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        if isinstance(n, yaml.MappingNode):
            for k, v in n.value:
                stack.append((v, where + (str(k.value) if isinstance(k, yaml.ScalarNode) else "?",)))
        elif isinstance(n, yaml.SequenceNode):
            stack.extend((v, where + (i,)) for i, v in enumerate(n.value))
        elif isinstance(n, yaml.ScalarNode) and "$" in n.value and "${" in n.value:
            value, errors = interpolate_value(n.value, environ)
            problems.extend(Problem(n.start_mark.line + 1, _display(where) or None, e) for e in errors)
            if value != n.value:
                changed = True
                if n.style is None and n.tag == loader.resolve(yaml.ScalarNode, n.value, (True, False)):
                    n.tag = loader.resolve(yaml.ScalarNode, value, (True, False))
                n.value = value
    problems.sort(key=lambda p: p.line or 0)
    return changed


def apply_override(data: dict, given: str, spec_name: str = "<string>") -> str:
    """Apply one ``--set dotted.path=VALUE`` to a spec's data, in place; return the dotted path.

    The path goes through mappings by key and lists by index (``steps.decompose.rank``,
    ``steps.generate.shape.0``); its last key may be new (a setting the file leaves at its
    default). ``VALUE`` is read as YAML (``32`` an integer, ``1e-6`` a float, ``true``, ``[10, 20]``,
    anything else text; quote it to keep a number as text).

    Raises
    ------
    SpecError
        Without ``=``, with a value YAML cannot read, or with a path that leads nowhere (the
        message names the part that is missing and what is there instead).
    """

    def fail(message: str) -> SpecError:
        return SpecError(spec_name, [Problem(None, None, f"--set {given}: {message}")])

    dotted, eq, raw = given.partition("=")
    dotted = dotted.strip()
    if not eq or not dotted:
        raise fail("expected KEY=VALUE with KEY a dotted path into the spec, e.g. steps.decompose.rank=32")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as exc:
        raise fail(f"the value is not YAML ({str(exc).splitlines()[0]}); quote it to give text") from None
    parts = dotted.split(".")
    node: Any = data
    for i, part in enumerate(parts):
        here = ".".join(parts[:i]) or "the spec"
        last = i == len(parts) - 1
        if isinstance(node, dict):
            key = next((k for k in node if str(k) == part), part)
            if last:
                node[key] = value
            elif key not in node:
                what = "steps" if parts[:i] == ["steps"] else "keys"
                has = ", ".join(map(str, node)) or "none"
                raise fail(f"{here} has no {part!r} (its {what}: {has})")
            else:
                node = node[key]
        elif isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise fail(f"{here} is a list of {len(node)}: {part!r} is not an index in it")
            if last:
                node[int(part)] = value
            else:
                node = node[int(part)]
        else:
            raise fail(f"{here} is a value ({node!r}), not a mapping or list: it has no {part!r}")
    return dotted


def _display(where: tuple) -> str:
    parts = list(where)
    # pydantic puts the union tag (the step kind) after the step name: not a key of the file
    if len(parts) > 2 and parts[0] == "steps" and parts[2] in STEP_TAGS:
        del parts[2]
    return ".".join(str(p) for p in parts)


def _allowed_keys(src: Source, where: tuple) -> list[str]:
    if len(where) >= 2 and where[0] == "steps":
        step = src.data.get("steps", {}).get(where[1]) if isinstance(src.data.get("steps"), dict) else None
        tag = _step_tag(step)
        if tag in DECOMPOSE_MODELS:
            return list(DECOMPOSE_MODELS[tag].model_fields)
        if tag in STEP_MODELS:
            return list(STEP_MODELS[tag].model_fields)
    return list(Spec.model_fields)


def _problem(src: Source, err: dict) -> Problem:
    where = tuple(err["loc"])
    kind, msg, got = err["type"], err["msg"], err.get("input")
    if kind == "extra_forbidden":
        message = f"unknown key (expected one of: {', '.join(_allowed_keys(src, where))})"
        tag = where[2] if len(where) > 3 and where[0] == "steps" else None
        if tag in DECOMPOSE_MODELS:
            # a key of another method (ranks without method: tucker, ...) says which method has it
            others = [_METHOD_OF[t] for t, m in DECOMPOSE_MODELS.items() if t != tag and where[-1] in m.model_fields]
            if others:
                message = (
                    f"unknown key (expected one of: {', '.join(_allowed_keys(src, where))}; with method: "
                    f"{_METHOD_OF[tag]}; {where[-1]!r} is a key of method: {' or '.join(others)})"
                )
    elif kind == "missing":
        message = "missing (required)"
    elif kind == "union_tag_invalid":
        message = f"unknown step kind {err['ctx']['tag']!r} (expected one of: {', '.join(STEP_KINDS)})"
        where = where + ("kind",)
    elif kind == "union_tag_not_found":
        message = f"missing 'kind' (expected one of: {', '.join(STEP_KINDS)})"
    elif kind == "literal_error" and where[-1] == "method" and len(where) == 4 and where[2] in DECOMPOSE_MODELS:
        message = (
            f"expected one of: {', '.join(DECOMPOSE_METHODS)} (for cp also its solver: exact, sts, arls-lev, "
            f"arls-lev-hybrid), got {got!r}"
        )
    else:
        message = msg.replace("Value error, ", "").replace("Input should be", "expected")
        if kind not in ("value_error", "assertion_error") and not isinstance(got, (dict, list)):
            message += f", got {got!r}"
        elif isinstance(got, (dict, list)) and "type" in kind:
            message += f", got a {'mapping' if isinstance(got, dict) else 'list'}"
    return Problem(src.line(where), _display(where) or None, message)


def validate_source(src: Source) -> Spec:
    """The :class:`Spec` model of a loaded source; every validation error with its line."""
    try:
        return Spec.model_validate(src.data)
    except ValidationError as exc:
        problems = src.annotate([_problem(src, e) for e in exc.errors(include_url=False)])
        problems.sort(key=lambda p: p.line or 0)
        raise SpecError(src.path, problems) from None


# --- the workflow as a whole -------------------------------------------------------------------------


@dataclass
class PlannedStep:
    """A step with its locations resolved and its dependencies found."""

    name: str
    model: _Step
    inputs: dict[str, str]  # role -> normalized location
    outputs: dict[str, str]  # role -> normalized location
    deps: list[str] = field(default_factory=list)

    @property
    def kind(self) -> str:
        return self.model.kind  # type: ignore[attr-defined]

    def config(self) -> dict:
        """The step's settings that define its result (for the fingerprint)."""
        config = self.model.fingerprint_settings(
            self.model.model_dump(mode="json", exclude={"after", "description", "retries", "retry_delay"})
        )
        # settings added later leave the fingerprints of steps that do not use them (unset, or at
        # their default) unchanged, so an upgrade does not rerun up-to-date steps
        fields = type(self.model).model_fields
        for name in getattr(self.model, "_added_later", ()):
            if config.get(name) is None or config.get(name) == fields[name].default:
                config.pop(name, None)
        return config


@dataclass
class Workflow:
    """A validated spec, ready to run: steps in dependency order, all locations resolved."""

    spec: Spec
    source: Source
    name: str
    root: str
    allowed: list[str]
    steps: list[PlannedStep]
    sha256: str
    operator_allowed: list[str] = field(default_factory=list)  # what the operator allows (a submit passes it on)

    @property
    def path(self) -> str:
        return self.source.path

    def step(self, name: str) -> PlannedStep:
        return next(s for s in self.steps if s.name == name)

    def outputs(self) -> list[str]:
        return sorted({o for s in self.steps for o in s.outputs.values()})


def default_storage() -> str:
    return os.environ.get("TFOOC_STORAGE", "storage")


ALLOW_ENV = "TFOOC_ALLOW_PATHS"
CONFIG_ENV = "TFOOC_CONFIG"


def config_path() -> str:
    """The operator's config file: ``$TFOOC_CONFIG``, else ``$XDG_CONFIG_HOME/tfooc/config.yaml``
    (``~/.config/tfooc/config.yaml``)."""
    if os.environ.get(CONFIG_ENV):
        return os.path.abspath(os.path.expanduser(os.environ[CONFIG_ENV]))
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "tfooc", "config.yaml")


def _config_allow_paths() -> list[tuple[str, str]]:
    """``allow_paths`` of the operator's config file ([] when there is none; ``$TFOOC_CONFIG``
    naming a missing file is an error)."""
    path = config_path()
    if not os.path.exists(path):
        if os.environ.get(CONFIG_ENV):
            raise SpecError(path, [Problem(None, None, f"no such config file (${CONFIG_ENV})")])
        return []
    with open(path, encoding="utf-8") as f:
        if not f.read().strip():
            return []
    src = read_source(path)
    unknown = [k for k in src.data if k != "allow_paths"]
    problems = [Problem(src.line((k,)), str(k), "unknown key (expected: allow_paths)") for k in unknown]
    entries = src.data.get("allow_paths") or []
    if not isinstance(entries, list):
        problems.append(Problem(src.line(("allow_paths",)), "allow_paths", "expected a list of folders or URLs"))
        entries = []
    out = []
    for i, e in enumerate(entries):
        if not isinstance(e, str) or not (loc.is_url(e) or os.path.isabs(os.path.expanduser(e))):
            problems.append(
                Problem(
                    src.line(("allow_paths", i)), f"allow_paths.{i}", f"expected an absolute path or a URL, got {e!r}"
                )
            )
            continue
        out.append((loc.normalize(e), f"{path}, line {src.line(('allow_paths', i))}"))
    if problems:
        raise SpecError(path, problems)
    return out


def operator_allow_paths(
    allow_paths: list[str] | tuple[str, ...] | None = None, *, environment: bool = True
) -> list[tuple[str, str]]:
    """Folders or URLs besides the storage root that the operator lets specs use, each with where
    it was given: ``allow_paths`` (``tfooc run/submit --allow-path``), and with ``environment``
    also ``$TFOOC_ALLOW_PATHS`` (``os.pathsep``-separated) and ``allow_paths`` in the config file
    (:func:`config_path`). A spec never widens this: its own ``allow_paths`` may only pick folders
    inside these (or inside the storage root)."""
    out = [(loc.normalize(a), "--allow-path") for a in (allow_paths or ()) if str(a).strip()]
    if environment:
        env = os.environ.get(ALLOW_ENV, "")
        out += [(loc.normalize(a), f"${ALLOW_ENV}") for a in env.split(os.pathsep) if a.strip()]
        out += _config_allow_paths()
    seen: set[str] = set()
    return [(a, w) for a, w in out if not (a in seen or seen.add(a))]


def real_location(location: str) -> str:
    """Where a location really is: local paths with every symbolic link resolved (as far as the
    path exists), URLs as they are."""
    return location if loc.is_url(location) else os.path.realpath(location)


def confined(location: str, allowed: list[str]) -> bool:
    """Is ``location``, symbolic links resolved, inside one of the ``allowed`` roots (also resolved)?"""
    real = real_location(location)
    return any(loc.is_under(real, real_location(a)) for a in allowed)


def _resolve(raw: str, root: str) -> str:
    return loc.normalize(raw, base=root)


def _produces(step: PlannedStep, location: str) -> bool:
    """Does ``step`` write something that ``location`` (a path, folder or glob) reads?"""
    for out in step.outputs.values():
        if out == location or (loc.has_glob(location) and fnmatch.fnmatch(out, location)):
            return True
        if not loc.has_glob(location) and loc.is_under(out, location) and out != location:
            return True  # a file made inside a folder that is read as a whole
    return False


def _outputs_over_inputs(planned: list[PlannedStep], src: Source) -> list[Problem]:
    """An output that is, contains or lies inside an input of its own step, or an input of the spec
    that no step makes (the user's data): refused before anything runs."""
    from ..store.destinations import overlap

    problems = []
    for st in planned:
        for orole, out in st.outputs.items():
            for other in planned:
                for irole, location in other.inputs.items():
                    if loc.has_glob(location):
                        continue
                    if other is not st and any(_produces(o, location) for o in planned):
                        continue  # made by a step of this spec: the flow between steps
                    how = overlap(out, location)
                    if how is None:
                        continue
                    where = ("steps", st.name, orole)
                    whose = "its own input" if other is st else f"the input of step {other.name!r}"
                    verb = {"is": "is", "contains": "contains", "inside": "lies inside"}[how]
                    problems.append(
                        Problem(
                            src.line(where),
                            _display(where),
                            f"{out} {verb} {whose} {irole} ({location}); writing there would destroy it",
                        )
                    )
    return problems


def _find_cycle(order: list[str], deps: dict[str, list[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for d in deps[n]:
            if state.get(d) == 1:
                return stack[stack.index(d) :] + [d]
            if d not in state:
                found = visit(d)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in order:
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def plan(
    spec: Spec, src: Source, storage: str | None = None, operator: list[tuple[str, str]] | None = None
) -> Workflow:
    """Resolve locations, check confinement, references, inputs and cycles; order the steps.

    ``operator``: the folders the operator allows besides the storage root, each with where it was
    given (:func:`operator_allow_paths`). The spec's ``allow_paths`` can only narrow them: each
    entry must be inside one of them or inside the storage root, and a spec that lists any may use
    only those (and the storage root); a spec without ``allow_paths`` may use all of them. Every
    location is checked with its symbolic links resolved.
    """
    problems: list[Problem] = []
    root_raw = storage or spec.storage or default_storage()
    root = loc.normalize(root_raw)
    operator = list(operator or [])
    granted_by_operator = [root] + [a for a, _ in operator]
    picked = []
    for i, extra in enumerate(spec.allow_paths):
        if not (loc.is_url(extra) or os.path.isabs(os.path.expanduser(extra))):
            problems.append(
                Problem(
                    src.line(("allow_paths", i)),
                    f"allow_paths.{i}",
                    f"expected an absolute path or a URL, got {extra!r}",
                )
            )
            continue
        extra = loc.normalize(extra)
        if not confined(extra, granted_by_operator):
            given = "; ".join([f"{root} (the storage root)"] + [f"{a} ({w})" for a, w in operator])
            real = real_location(extra)
            problems.append(
                Problem(
                    src.line(("allow_paths", i)),
                    f"allow_paths.{i}",
                    f"{extra}{f' (really {real})' if real != extra else ''} is not inside a "
                    f"folder the operator allows ({given}): a spec can only narrow its sandbox. "
                    f"The operator allows more with tfooc run/submit --allow-path PATH, "
                    f"${ALLOW_ENV}, or allow_paths in {config_path()}",
                )
            )
            continue
        picked.append(extra)
    allowed = [root] + (picked if spec.allow_paths else [a for a, _ in operator])
    names = list(spec.steps)
    planned: list[PlannedStep] = []
    writers: dict[str, str] = {}
    for name in names:
        model = spec.steps[name]
        resolved: dict[str, dict[str, str]] = {"in": {}, "out": {}}
        for side, fields in (("in", model.input_fields()), ("out", model.output_fields())):
            for role, raw in fields.items():
                where = ("steps", name, role)
                location = _resolve(raw, root)
                if not confined(location, allowed):
                    what = "output" if side == "out" else "input"
                    real = real_location(location)
                    others = f" and the allowed paths {', '.join(allowed[1:])}" if allowed[1:] else ""
                    if any(loc.is_under(location, a) for a in allowed):
                        why = (
                            f"{what} {location} goes through a symbolic link to {real}, outside the storage "
                            f"root {root}{others}"
                        )
                    else:
                        why = (
                            f"{what} {location} is outside the storage root {root}{others} (the operator can "
                            f"allow its folder: tfooc run/submit --allow-path FOLDER, ${ALLOW_ENV}, or "
                            f"allow_paths in {config_path()})"
                        )
                    problems.append(Problem(src.line(where), _display(where), why))
                    continue
                if side == "out":
                    if any(real_location(location).rstrip("/") == real_location(a).rstrip("/") for a in allowed):
                        # writing (or replacing) the root would take every other output and the
                        # run records with it
                        problems.append(
                            Problem(
                                src.line(where),
                                _display(where),
                                f"output {location} is the storage root (or an allowed folder) "
                                f"itself; name a file or folder inside it",
                            )
                        )
                        continue
                    if loc.has_glob(location):
                        problems.append(
                            Problem(
                                src.line(where), _display(where), f"expected one output location, got a glob {raw!r}"
                            )
                        )
                        continue
                    if location in writers:
                        problems.append(
                            Problem(
                                src.line(where),
                                _display(where),
                                f"{location} is also written by step {writers[location]!r}: each output has one writer",
                            )
                        )
                        continue
                    writers[location] = name
                resolved[side][role] = location
        for i, dep in enumerate(model.after):
            if dep not in spec.steps:
                problems.append(
                    Problem(
                        src.line(("steps", name, "after", i)),
                        f"steps.{name}.after.{i}",
                        f"unknown step {dep!r} (steps: {', '.join(names)})",
                    )
                )
        planned.append(PlannedStep(name, model, resolved["in"], resolved["out"]))
    # dependencies: explicit 'after' plus every step whose output this step reads
    for st in planned:
        deps = [d for d in st.model.after if d in spec.steps]
        for location in st.inputs.values():
            for other in planned:
                if other.name != st.name and _produces(other, location) and other.name not in deps:
                    deps.append(other.name)
        st.deps = deps
    cycle = _find_cycle(names, {s.name: s.deps for s in planned})
    if cycle:
        problems.append(
            Problem(
                src.line(("steps", cycle[0])),
                f"steps.{cycle[0]}",
                "cyclic dependency: "
                + " -> ".join(cycle)
                + " (a step reads what a later step of the cycle writes, or 'after' loops)",
            )
        )
    else:
        problems.extend(_outputs_over_inputs(planned, src))
        # inputs that no step makes must exist now
        for st in planned:
            for role, location in st.inputs.items():
                if any(_produces(o, location) for o in planned if o.name != st.name):
                    continue
                target = location
                if loc.has_glob(location):
                    # a glob may match nothing yet (a folder of new files); its folder must exist
                    target = location
                    while loc.has_glob(target):
                        target = target.rsplit("/", 1)[0]
                where = ("steps", st.name, role)
                if not loc.exists(target):
                    problems.append(
                        Problem(
                            src.line(where),
                            _display(where),
                            f"missing input: {target} does not exist and no step writes it",
                        )
                    )
        for st in planned:
            if st.kind == "export" and st.model.format == "pyttb":  # type: ignore[attr-defined]
                # pyttb's export_data writes CP models only: a Tucker or completion result made by a
                # step of this spec is known not to fit before anything runs
                maker = next((o for o in planned if _produces(o, st.inputs.get("result", ""))), None)
                method = getattr(maker.model, "method_name", "cp") if maker is not None else "cp"
                if maker is not None and maker.kind == "decompose" and method not in CP_RESULT_METHODS:
                    where = ("steps", st.name, "format")
                    problems.append(
                        Problem(
                            src.line(where),
                            _display(where),
                            f"format 'pyttb' exports CP results; step {maker.name!r} makes a {method} result "
                            "(export it as npz, tensorly or zarr)",
                        )
                    )
            if st.kind == "export":
                fmt = st.model.format  # type: ignore[attr-defined]
                need = EXPORT_NEEDS.get(fmt)
                if need and importlib.util.find_spec(need) is None:
                    where = ("steps", st.name, "format")
                    problems.append(
                        Problem(
                            src.line(where),
                            _display(where),
                            f"format {fmt!r} needs the {need} package: pip install {need}",
                        )
                    )
    if problems:
        problems = src.annotate(problems)
        problems.sort(key=lambda p: p.line or 0)
        raise SpecError(src.path, problems)
    # dependency order, declaration order among independent steps
    order: list[PlannedStep] = []
    done: set[str] = set()
    while len(order) < len(planned):
        for st in planned:
            if st.name not in done and all(d in done for d in st.deps):
                order.append(st)
                done.add(st.name)
                break
    name = spec.name or os.path.splitext(os.path.basename(src.path))[0].replace(".yaml", "") or "workflow"
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", name)
    return Workflow(
        spec,
        src,
        name,
        root,
        allowed,
        order,
        hashlib.sha256(src.effective_text.encode()).hexdigest(),
        [a for a, _ in operator],
    )


def load_spec(
    path: str | os.PathLike | None = None,
    *,
    text: str | None = None,
    storage: str | None = None,
    allow_paths: list[str] | tuple[str, ...] | None = None,
    operator_config: bool = True,
    overrides: Sequence[str] = (),
    interpolate: bool = True,
) -> Workflow:
    """Read, validate and plan a spec.

    Parameters
    ----------
    path : str or PathLike, optional
        The spec file (local or fsspec URL). With ``text``, only used in messages.
    text : str, optional
        The spec's YAML text (instead of reading ``path``).
    storage : str, optional
        Storage root overriding the spec's ``storage`` (default: the spec's, else
        ``$TFOOC_STORAGE``, else ``./storage``).
    allow_paths : list of str, optional
        Folders or URLs besides the storage root that the operator lets the spec use (``tfooc run
        --allow-path``). The spec's own ``allow_paths`` can only pick folders inside these.
    operator_config : bool
        Also take the operator's ``$TFOOC_ALLOW_PATHS`` and the config file's ``allow_paths``
        (:func:`operator_allow_paths`); False uses ``allow_paths`` alone (a submitted driver gets
        the list the submitting command used).
    overrides : sequence of str
        ``dotted.path=VALUE`` settings applied over the file (``tfooc run --set``), e.g.
        ``steps.decompose.rank=32`` (:func:`apply_override`).
    interpolate : bool
        Replace ``${VAR}`` and ``${VAR:-default}`` in values from the environment
        (:func:`interpolate_value`); False for a text resolved already (a submitted driver's,
        which must not depend on the worker's environment).

    Returns
    -------
    Workflow

    Raises
    ------
    SpecError
        Naming the file, line and field of every problem found.
    """
    operator = operator_allow_paths(allow_paths, environment=operator_config)
    src = read_source(path, text, overrides=overrides, interpolate=interpolate)
    spec = validate_source(src)
    return plan(spec, src, storage, operator)


def spec_schema() -> dict:
    """The JSON Schema (draft 2020-12) of a workflow spec, from the pydantic models: for editors
    (YAML language servers) and for checking specs outside tfooc (``tfooc schema``)."""
    schema = Spec.model_json_schema()
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "tfooc workflow spec",
        **{k: v for k, v in schema.items() if k != "title"},
    }
