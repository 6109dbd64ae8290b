"""The workflow spec's pydantic models: one per step kind (and per decomposition method), the spec
itself, and the sizes and names they accept."""

from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar, Literal, Union

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    NonNegativeInt,
    Tag,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)

from ..decompositions.apr.options import CP_APR
from ..decompositions.apr.options import FOR_ALGORITHM as APR_FOR_ALGORITHM
from ..decompositions.common.options import Option, OptionSet
from ..decompositions.completion.options import TUCKER_SGD
from ..decompositions.cp.options import CP_ALS
from ..decompositions.tt.options import RANDOMIZED_ONLY as TT_RANDOMIZED_ONLY
from ..decompositions.tt.options import TT_ALS
from ..decompositions.tucker.options import TUCKER_HOOI
from ..ingest.table_options import BUCKET_UNITS, TABLE_FORMATS, TABLE_SUFFIXES, table_option
from ..limits import MAX_COUNT

SPEC_VERSION = 1


STEP_KINDS = ("generate", "convert", "decompose", "evaluate", "export", "predict")


DECOMPOSE_METHODS = ("cp", "tucker", "completion", "cp-apr", "tt")


# methods whose results are CP models (weights and factors): pyttb exports, factor match scores
CP_RESULT_METHODS = ("cp", "cp-apr")


PRESET_NAMES = ("uber", "nips", "chicago", "nell2", "vast", "hypersparse", "amazon")


EXPORT_FORMATS = ("npz", "pyttb", "tensorly", "zarr", "parquet")


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
    # the fiber index of these modes ("all" or mode numbers): sampled rounds read only the sampled
    # fibers; an append keeps the modes the latest version's index holds
    fiber_index: Literal["all"] | list[NonNegativeInt] | None = None
    # a table's columns (Parquet or CSV input): declared once in ingest.table_options
    modes: list[str] | None = Field(None, description=table_option("modes").help)
    value: str | None = Field(None, description=table_option("value").help)
    bucket: dict[str, Literal[BUCKET_UNITS]] | None = Field(  # type: ignore[valid-type]
        None, description=table_option("bucket").help
    )
    table_format: Literal[TABLE_FORMATS] | None = Field(  # type: ignore[valid-type]
        None, description=table_option("table_format").help
    )
    _added_later: ClassVar[tuple[str, ...]] = (
        "values_dtype",
        "fiber_index",
        "modes",
        "value",
        "bucket",
        "table_format",
    )

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
        table = [k for k in ("value", "bucket", "table_format") if getattr(self, k) is not None]
        if table and self.modes is None:
            raise ValueError(f"{', '.join(table)} apply to tables only: name the key columns with 'modes'")
        if self.modes is not None and self.shape is not None:
            raise ValueError("a table's shape is the number of keys of each mode: give no 'shape'")
        return self

    def input_fields(self) -> dict[str, str]:
        return {"input": self.input}


def _annotation(o: Option) -> Any:
    """The pydantic type of a declared option's values in a spec."""
    v = o.values
    choices = o.spec_choices or v.choices
    if choices:
        kind: Any = Literal[choices]  # type: ignore[valid-type]
    elif v.kind == "bool":
        kind = bool
    elif v.kind == "str":
        kind = str
    elif v.kind == "size":
        kind = Annotated[Union[int, str], AfterValidator(parse_size)]
    elif v.kind in ("int", "seed"):
        kind = Annotated[int, Field(ge=int(v.low or 0), le=MAX_COUNT)]
    else:
        bounds = {
            ("gt" if v.low_open else "ge"): v.low,
            ("lt" if v.high_open else "le"): v.high,
        }
        kind = Annotated[float, Field(allow_inf_nan=False, **{k: b for k, b in bounds.items() if b is not None})]
    default = o.default_on("spec")
    return kind | None if v.optional or default is None else kind


def _required(a: Option) -> Any:
    """The pydantic type of a method's required argument: a rank, or ranks (one, or a list)."""
    return PositiveInt | list[PositiveInt] if a.values.kind == "ranks" else PositiveInt


def _declared(name: str, base: type, options: OptionSet) -> type:
    """``base`` with a field for each of ``options`` that specs take (its declared name, values,
    default and help), and ``_added_later`` the keys specs gained after their first version."""
    fields = {a.name: (_required(a), Field(description=a.help)) for a in options.arguments}
    fields.update(
        {o.spec_key: (_annotation(o), Field(o.default_on("spec"), description=o.help)) for o in options.in_spec()}
    )
    model = create_model(name, __base__=base, __module__=__name__, **fields)  # type: ignore[call-overload]
    model._declared_options = options
    return model


class _Decompose(_Step):
    """What every decomposition step shares: its input, its result store, the warm start and where
    it runs; each method's own settings come from its declared options."""

    kind: Literal["decompose"]
    input: str = Field(
        description="a BLCO store or a versioned store folder (its latest version); method cp also takes a "
        "dense Zarr array"
    )
    out: str = Field(description="the result store")
    init: str = Field(
        "random",
        description="random; previous (warm start from 'previous', default 'out' as the last run left it); "
        "or a result store path",
    )
    previous: str | None = None
    scheduler: Literal["auto", "inline", "cluster"] = Field(
        "auto",
        description="auto: in the driver for tensors of at most 2^24 nonzeros, on the cluster above; "
        "inline: always in the driver; cluster: always as Dask graphs on the cluster",
    )
    _inits: ClassVar[tuple[str, ...]] = ("random", "previous")
    _declared_options: ClassVar[OptionSet]

    @model_validator(mode="after")
    def _previous(self) -> _Decompose:
        if self.previous is not None and self.init != "previous":
            raise ValueError("'previous' is only used with init: previous")
        return self

    @property
    def _added_later(self) -> tuple[str, ...]:
        return tuple(o.spec_key for o in self._declared_options.in_spec() if o.spec_added_later)

    def declared_values(self) -> dict[str, Any]:
        """The step's values of its method's declared options, by option name (the API's)."""
        return {o.name: getattr(self, o.spec_key) for o in self._declared_options.in_spec()}

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


class DecomposeStep(_declared("_CPOptions", _Decompose, CP_ALS)):  # type: ignore[misc]
    """Rank-``rank`` CP-ALS of a store or a dense Zarr array (:func:`tensorflow_ooc.cp_als` with its
    options); ``method: cp`` (the default) or one of CP-ALS's solvers.

    ``init: previous`` warm-starts from the previous result (``previous``, default ``out`` as the
    last run left it); rows that a growing mode gained since are initialized at random at the
    scale of the existing rows. ``init`` may also name a result store.

    ``nonnegative: true`` runs nonnegative CP-ALS (HALS mode updates, every factor >= 0) with
    ``reg``, its L2 regularization; both enter the fingerprint only when set away from their
    defaults, so specs written before them keep theirs.
    """

    @model_validator(mode="after")
    def _nonnegative(self) -> DecomposeStep:
        if self.reg > 0 and not self.nonnegative:
            raise ValueError("'reg' regularizes nonnegative CP-ALS: set nonnegative: true (or drop reg)")
        if self.nonnegative and self.solver != "exact":
            raise ValueError(f"nonnegative: true takes method: cp (exact), not {self.method}")
        return self

    @property
    def solver(self) -> str:
        """CP-ALS's ``method``: ``exact`` or a randomized solver."""
        return "exact" if self.method == "cp" else self.method

    def declared_values(self) -> dict[str, Any]:
        return {**super().declared_values(), "method": self.solver}

    def fingerprint_settings(self, config: dict) -> dict:
        # 'cp' is CP-ALS's exact solver, which specs wrote as 'exact' (the default) before methods
        # other than CP existed: the same settings keep the same fingerprint
        return {**config, "method": self.solver}


class TuckerDecomposeStep(_declared("_TuckerOptions", _Decompose, TUCKER_HOOI)):  # type: ignore[misc]
    """Tucker HOOI of a store (:func:`tensorflow_ooc.tucker_hooi`, ``tfooc tucker``): core size
    ``ranks`` (one per mode, or one for every mode). ``init: previous`` (or a Tucker result)
    starts from that result's factors: rows a growing mode gained since are drawn at random at the
    scale of the old rows, a larger rank gets random columns, a smaller one keeps the leading ones."""

    method: Literal["tucker"]
    _inits: ClassVar[tuple[str, ...]] = ("random", "nvecs", "previous")

    @property
    def method_name(self) -> str:
        return "tucker"


class CompletionDecomposeStep(_declared("_CompletionOptions", _Decompose, TUCKER_SGD)):  # type: ignore[misc]
    """FastTucker tensor completion of a store by FastTuckerPlus SGD (:func:`tensorflow_ooc.tucker_sgd`,
    ``tfooc complete``): factor ranks ``ranks``, Kruskal core rank ``core_rank``, tested every epoch
    on ``test`` (a store) or a seeded ``test_fraction`` of the input. ``init: previous`` (or a
    FastTucker result) continues training from that model: rows a growing mode gained since start
    at random at the scale of the old rows; other ranks than the previous model's start at random."""

    method: Literal["completion"]

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


def _only_for(field: str, allowed: str, data: dict) -> None:
    # an option of another algorithm is an error at its own line rather than a setting silently unused
    algorithm = data.get("algorithm")
    if algorithm is not None and algorithm != allowed:
        raise ValueError(f"{field!r} is only for algorithm: {allowed} (this step runs algorithm: {algorithm})")


class PoissonDecomposeStep(_declared("_PoissonOptions", _Decompose, CP_APR)):  # type: ignore[misc]
    """CP-APR of a store of counts (:func:`tensorflow_ooc.cp_apr`, ``tfooc apr``): rank-``rank``
    nonnegative CP by Poisson maximum likelihood, by multiplicative updates (``algorithm: mu``) or
    row-wise projected damped Newton (``algorithm: pdnr``). ``init: previous`` (or a CP result:
    CP-APR's own, or CP-ALS's) starts from that model as a CP warm start does; CP-APR needs
    nonnegative factors, so a CP-ALS result's negative entries are taken by absolute value (the
    step logs how many). Checkpoints and resumes as CP-ALS does."""

    method: Literal["cp-apr"]

    @field_validator(*APR_FOR_ALGORITHM, check_fields=False)
    @classmethod
    def _for_algorithm(cls, v: Any, info: ValidationInfo) -> Any:
        # run for given keys only, after 'algorithm' (declared first)
        _only_for(info.field_name, APR_FOR_ALGORITHM[info.field_name], info.data)
        return v

    @property
    def method_name(self) -> str:
        return "cp-apr"


class TTDecomposeStep(_declared("_TTOptions", _Decompose, TT_ALS)):  # type: ignore[misc]
    """Tensor-train ALS of a store (:func:`tensorflow_ooc.tt_als`, ``tfooc tt``): inner TT ranks
    ``ranks`` (``N - 1`` of them, or one for all), by exact sweeps or randomized rTT-ALS
    (``algorithm: randomized``: each core update solves a sketch of ``samples`` rows drawn by
    their leverage scores). ``init: previous`` (or a TT result) starts from that train's cores:
    slices a growing mode gained since are drawn at random at the scale of the core's old ones; a
    previous train of other ranks is not used (the step logs it and starts at random).
    Checkpoints and resumes as CP-ALS does."""

    method: Literal["tt"]

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

    @field_validator(*TT_RANDOMIZED_ONLY, check_fields=False)
    @classmethod
    def _for_algorithm(cls, v: Any, info: ValidationInfo) -> Any:
        _only_for(info.field_name, "randomized", info.data)
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
    coords: str = Field(
        description="a .tns/.tns.gz file of coordinates or a store; for a CP result of a table, a Parquet or "
        "CSV file of keys (a column per mode name)"
    )
    out: str = Field(description=".tns, .tns.gz or .npz; for keys, .parquet or .csv (the keys and 'prediction')")
    zero_based: bool = Field(False, description=".tns files in and out: indices from 0 (default from 1, as FROSTT)")
    unknown: Literal["error", "skip"] = Field(
        "error", description="keys the model does not know: an error naming them, or their rows left out"
    )
    _added_later: ClassVar[tuple[str, ...]] = ("unknown",)

    @field_validator("out")
    @classmethod
    def _out(cls, v: str) -> str:
        if not v.endswith((".tns", ".tns.gz", ".npz", ".parquet", ".csv")):
            raise ValueError(f"expected a .tns, .tns.gz, .npz, .parquet or .csv file, got {v!r}")
        return v

    @model_validator(mode="after")
    def _keys(self) -> PredictStep:
        keyed = self.coords.lower().endswith(TABLE_SUFFIXES)
        if keyed != self.out.endswith((".parquet", ".csv")):
            raise ValueError(
                "keys in, keys out: a Parquet or CSV file of keys predicts into a .parquet or .csv, coordinates "
                "into .tns, .tns.gz or .npz"
            )
        return self

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


_URL = re.compile(r"^https?://[^\s/]+\S*$")


_VARIABLE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class Webhooks(_Model):
    """URLs that receive one JSON object (an HTTP POST) when a run succeeds, fails, or retries a
    step or its driver; a webhook that fails is logged, never the run's failure."""

    on_success: str | list[str] | None = Field(None, description="URL(s) told when a run ends done or skipped")
    on_failure: str | list[str] | None = Field(None, description="URL(s) told when a run fails")
    on_retry: str | list[str] | None = Field(
        None, description="URL(s) told when a step is tried again, or a driver restarts after a lost worker"
    )

    @field_validator("on_success", "on_failure", "on_retry")
    @classmethod
    def _urls(cls, v: str | list[str] | None) -> str | list[str] | None:
        for url in [v] if isinstance(v, str) else v or []:
            if not _URL.match(url):
                raise ValueError(f"expected an http:// or https:// URL, got {url!r}")
        if isinstance(v, list) and not v:
            raise ValueError("expected a URL or a list of URLs")
        return v

    def urls(self, event: str) -> list[str]:
        """The URLs of ``event`` (``on_success``, ``on_failure`` or ``on_retry``)."""
        v = getattr(self, event)
        return [v] if isinstance(v, str) else list(v or [])


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
    webhooks: Webhooks | None = Field(
        None, description="URLs told of the run's success, failure and retries (one JSON object, POST)"
    )
    secrets: list[str] = Field(
        default_factory=list,
        description="names of variables whose values are secret: never written to run records, events, "
        "logs or notifications (besides those matching the operator's patterns, *TOKEN*, *PASSWORD*, ...)",
    )
    steps: dict[str, Step]

    @field_validator("secrets")
    @classmethod
    def _secrets(cls, v: list[str]) -> list[str]:
        bad = [n for n in v if not _VARIABLE.match(n)]
        if bad:
            raise ValueError(f"expected variable names (letters, digits, '_'), got {bad[0]!r}")
        return v

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
