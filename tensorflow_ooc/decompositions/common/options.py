"""Options declared once: each decomposition's options, from which its API signature and docstring,
its CLI command's flags and its workflow step model are all built.

An :class:`Option` says what one setting is (name, default, the values it takes, one help text)
and where it appears: the API keyword, the CLI flag, the workflow spec key. A method's
:class:`OptionSet` is the run-control options it takes (:data:`RUN_CONTROL`, shared by every
family) followed by its own knobs. This module imports nothing heavy: the CLI builds its parser
from it before any kernel loads.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

SAME: Any = object()  # a surface's default or key that is the API's
REQUIRED: Any = inspect.Parameter.empty  # an argument's default: it has none


@dataclass(frozen=True)
class Values:
    """What an option accepts: ``kind`` (``int``, ``float``, ``bool``, ``str``, ``size``, ``ranks``,
    ``seed`` or ``object``), bounds, choices, and whether None (the default rule) is accepted."""

    kind: str
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    choices: tuple[str, ...] | None = None
    optional: bool = False


COUNT = Values("int", low=1)
OPTIONAL_COUNT = Values("int", low=1, optional=True)
NONNEGATIVE_COUNT = Values("int", low=0)
SEED = Values("seed", low=0, optional=True)
TOLERANCE = Values("float", low=0)
OPTIONAL_TOLERANCE = Values("float", low=0, optional=True)
POSITIVE = Values("float", low=0, low_open=True)
OPTIONAL_POSITIVE = Values("float", low=0, low_open=True, optional=True)
FRACTION = Values("float", low=0, high=1, low_open=True, high_open=True, optional=True)
FLAG = Values("bool")
TEXT = Values("str", optional=True)
SIZE = Values("size", optional=True)
RANKS = Values("ranks")
ANY = Values("object", optional=True)


def choice(*names: str, optional: bool = False) -> Values:
    return Values("str", choices=tuple(names), optional=optional)


@dataclass(frozen=True)
class Option:
    """One setting of a decomposition.

    ``name`` is the API keyword; ``flags`` the CLI's (empty: ``--name-with-dashes``; None: not on
    the CLI); ``spec`` the workflow key (SAME: the name; None: not in specs). ``help`` is the one
    text every surface shows; ``details`` adds to it in the API docstring only. A surface whose
    default differs says so in ``cli_default`` or ``spec_default``; ``spec_added_later`` keeps the
    fingerprints of specs written before the key existed."""

    name: str
    default: Any
    values: Values
    annotation: str
    help: str
    details: str = ""
    flags: tuple[str, ...] | None = ()
    spec: str | None = SAME
    cli_default: Any = SAME
    spec_default: Any = SAME
    cli_choices: tuple[str, ...] | None = None
    spec_choices: tuple[str, ...] | None = None
    metavar: str | None = None
    group: str | None = None  # CLI: options of one group exclude each other
    spec_added_later: bool = False
    api: bool = True  # False: the CLI and specs only (the API takes it inside another option)

    def replace(self, **changes: Any) -> Option:
        return dataclasses.replace(self, **changes)

    @property
    def cli_flags(self) -> tuple[str, ...]:
        return self.flags or ("--" + self.name.replace("_", "-"),)

    @property
    def spec_key(self) -> str | None:
        return self.name if self.spec is SAME else self.spec

    def default_on(self, surface: str) -> Any:
        """The default on ``surface`` (``api``, ``cli`` or ``spec``)."""
        own = {"cli": self.cli_default, "spec": self.spec_default}.get(surface, SAME)
        return self.default if own is SAME else own


@dataclass(frozen=True)
class OptionSet:
    """A method's options in the order its signature lists them, with the names of its run-control
    options (the rest are the method's own knobs)."""

    method: str
    options: tuple[Option, ...]
    run_control: frozenset[str] = field(default_factory=frozenset)
    arguments: tuple[Option, ...] = ()  # the method's required arguments, after the input, in order

    def __iter__(self) -> Iterator[Option]:
        return iter(self.options)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(o.name for o in self.options if o.api)

    def on_cli(self) -> list[Option]:
        return [o for o in self.options if o.flags is not None]

    def in_spec(self) -> list[Option]:
        return [o for o in self.options if o.spec_key is not None]

    def bind(self, given: dict[str, Any]) -> dict[str, Any]:
        """Every API option's value: ``given`` over the defaults; an unknown keyword is a TypeError
        naming it, as Python's own for a written-out signature."""
        unknown = [k for k in given if k not in self.names]
        if unknown:
            raise TypeError(f"{self.method}() got an unexpected keyword argument {unknown[0]!r}")
        return {o.name: given.get(o.name, o.default) for o in self.options if o.api}

    def settings(self, given: dict[str, Any]) -> tuple[Any, Any]:
        """(run control, the method's own knobs) as typed objects: ``given`` over the defaults."""
        values = self.bind(given)
        run = {k: v for k, v in values.items() if k in self.run_control}
        return RunControl(**run), _knobs_type(self)(**{k: v for k, v in values.items() if k not in run})

    def parameters(self) -> list[inspect.Parameter]:
        """The keyword-only parameters of the API function."""
        return [
            inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, default=o.default, annotation=o.annotation)
            for o in self.options
            if o.api
        ]

    def docstring(self) -> str:
        """The numpy-style lines for the arguments and keyword options (after the input's)."""
        lines = []
        for o in (*self.arguments, *self.options):
            if not o.api:
                continue
            kind = "{" + ", ".join(repr(c) for c in o.values.choices) + "}" if o.values.choices else o.annotation
            lines.append(f"{o.name} : {kind}" + ("" if o.default is REQUIRED else f", default {o.default!r}"))
            text = o.help[0].upper() + o.help[1:] + "." if o.help else ""
            if o.details:
                text += " " + o.details
            lines.extend("    " + line for line in _wrap(text, 92))
        return "\n".join(lines)


@functools.cache
def _knobs_type(options: OptionSet) -> type:
    fields = [(o.name, o.annotation, field(default=o.default)) for o in options if o.api]
    name = "".join(part.title() for part in options.method.split("_")) + "Options"
    return dataclasses.make_dataclass(name, [f for f in fields if f[0] not in options.run_control], kw_only=True)


def option_set(
    method: str, run_control: Iterable[Option], knobs: Iterable[Option], arguments: Iterable[Option] = ()
) -> OptionSet:
    run = tuple(run_control)
    return OptionSet(method, run + tuple(knobs), frozenset(o.name for o in run), tuple(arguments))


def argument(name: str, values: Values, annotation: str, help_text: str) -> Option:
    """A required argument of a method (its rank, its ranks)."""
    return Option(name, REQUIRED, values, annotation, help_text)


def _wrap(text: str, width: int) -> list[str]:
    import textwrap

    return textwrap.wrap(text, width) or [""]


def declared(options: OptionSet) -> Callable[[Callable], Callable]:
    """Give a public function ``f(positional..., **options)`` the signature and Parameters lines of
    its declared options (``inspect.signature``, ``help()`` and IDEs show them); ``{options}`` in
    its docstring marks where the lines go."""

    def wrap(f: Callable) -> Callable:
        own = [p for p in inspect.signature(f).parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
        if [p.name for p in own[1:]] != [a.name for a in options.arguments]:
            raise TypeError(f"{f.__name__} takes {[p.name for p in own[1:]]}, declared {options.arguments}")
        f.__signature__ = inspect.signature(f).replace(parameters=own + options.parameters())  # type: ignore[attr-defined]
        if f.__doc__ and "{options}" in f.__doc__:
            indent = f.__doc__.split("{options}")[0].rsplit("\n", 1)[-1]
            lines = options.docstring().replace("\n", "\n" + indent)
            f.__doc__ = f.__doc__.replace("{options}", lines)
        return f

    return wrap


# --- run control: what every family takes to run (a method lists the ones it uses) ----------------

CLIENT = Option(
    "client",
    None,
    ANY,
    "distributed.Client | None",
    "cluster to run on",
    details="Default: an embedded in-process LocalCluster (dashboard link logged), or the scheduler "
    "at ``scheduler``; tensors of at most 2^24 nonzeros run the same task functions in this process, "
    "without Dask (``scheduler='embedded'`` keeps the LocalCluster and dashboard).",
    flags=None,
    spec=None,
)
SCHEDULER = Option(
    "scheduler",
    None,
    TEXT,
    "str | None",
    "address of an existing Dask scheduler; 'embedded' for the in-process Dask cluster (dashboard "
    "link logged); 'inline' to run in this process without Dask (default: inline up to 2^24 "
    "nonzeros, embedded above)",
    spec=None,  # a spec's scheduler chooses between the driver and the run's cluster
)
EXECUTION = Option(
    "execution",
    "auto",
    choice("auto", "streaming", "in-memory"),
    "str",
    "stream chunks each pass or keep decoded blocks on workers (default: by memory)",
    details="See :class:`tensorflow_ooc.execution.MTTKRPGraph`.",
)
PARTITIONS = Option(
    "partitions",
    None,
    OPTIONAL_COUNT,
    "int | None",
    "partition tasks per pass (default one per Dask thread)",
)
DEVICE = Option(
    "device",
    "auto",
    choice("auto", "cpu", "gpu"),
    "str",
    "where the kernels run: gpu = GPU workers (LocalCUDACluster when GPUs are visible and dask-cuda "
    "is installed; an error if no worker can run GPU kernels), cpu = CPU workers, auto = GPUs when "
    "the cluster has them",
    spec_default=None,  # a spec's default is the run's cluster's device
)
DEVICE_OPTIONS = Option(
    "device_options",
    None,
    ANY,
    "DeviceOptions | None",
    "GPU kernel and streaming settings (conflict resolution, streams, device memory limit)",
    flags=None,
    spec=None,
)
CONFLICT = Option(
    "conflict",
    "auto",
    choice("auto", "hierarchical", "register"),
    "str",
    "GPU conflict resolution (auto: hierarchical when the target mode is shorter than the device's SM count)",
    api=False,
)
STREAMS = Option("streams", 8, COUNT, "int", "CUDA streams for GPU streaming", api=False)
DEVICE_MEMORY_LIMIT = Option(
    "device_memory_limit",
    None,
    SIZE,
    "int | str | None",
    "device memory a GPU task may use, e.g. 8GiB (default 80% of free device memory); tensors "
    "larger than this are streamed in batches",
    api=False,
)
CHECKPOINT = Option(
    "checkpoint",
    None,
    TEXT,
    "str | os.PathLike | None",
    "checkpoint file, written atomically every CHECKPOINT_EVERY iterations (CLI default: OUT.checkpoint.npz)",
    spec=None,  # a workflow keeps its checkpoints in its state folder
)
RESUME = Option(
    "resume",
    False,
    FLAG,
    "bool",
    "continue from the checkpoint if it exists (the same input and settings)",
    spec=None,
)
CHECKPOINT_EVERY = Option("checkpoint_every", 1, COUNT, "int", "write the checkpoint every this many iterations")
OUT = Option(
    "out",
    None,
    TEXT,
    "str | os.PathLike | None",
    "result store (CLI default: beside STORE, named after the method and rank)",
    spec=None,  # every step's own key
)
OVERWRITE = Option(
    "overwrite",
    False,
    FLAG,
    "bool",
    "replace an existing result at OUT that this package wrote (without it, an existing result is an error)",
    spec=None,
)
CALLBACK = Option(
    "callback",
    None,
    ANY,
    "Callable[[dict], None] | None",
    "called with each iteration's history record",
    flags=None,
    spec=None,
)
PROGRESS = Option("progress", True, FLAG, "bool", "show a progress bar of the iterations", flags=None, spec=None)
DISTRIBUTION = Option(
    "distribution",
    "auto",
    choice("auto", "owner", "graph"),
    "str",
    "how the run spreads over several workers: owner = owner-computes (each worker keeps its "
    "partitions and the factor rows it owns, one task per worker and iteration, rows sent only where "
    "shared); graph = per-mode task graphs (what one worker and the inline scheduler always use); "
    "auto = owner on a cluster of several workers, else graph",
    spec=None,
)

RUN_CONTROL = (
    CLIENT,
    SCHEDULER,
    EXECUTION,
    PARTITIONS,
    DEVICE,
    DEVICE_OPTIONS,
    CONFLICT,
    STREAMS,
    DEVICE_MEMORY_LIMIT,
    CHECKPOINT,
    RESUME,
    CHECKPOINT_EVERY,
    OUT,
    OVERWRITE,
    CALLBACK,
    PROGRESS,
    DISTRIBUTION,
)


# the run control of a family that checkpoints its iterations (names; a family adds its own)
CHECKPOINTED = (
    "client",
    "scheduler",
    "execution",
    "partitions",
    "checkpoint",
    "resume",
    "checkpoint_every",
    "out",
    "overwrite",
    "callback",
)


def run_control(*names: str, **defaults: Any) -> tuple[Option, ...]:
    """The run-control options ``names`` (in :data:`RUN_CONTROL`'s order), with a method's own
    ``defaults`` (or whole options) where they differ."""
    chosen = [o for o in RUN_CONTROL if o.name in names]
    missing = set(names) - {o.name for o in chosen}
    if missing:
        raise KeyError(f"no run-control option {sorted(missing)}")
    return tuple(_override(o, defaults[o.name]) if o.name in defaults else o for o in chosen)


def _override(option: Option, change: Any) -> Option:
    # a method's own form of a run-control option (its values, its surfaces), or only its default
    return change if isinstance(change, Option) else option.replace(default=change)


def seed_option(help_text: str, default: int | None = None) -> Option:
    # a spec's runs are reproducible unless asked otherwise: seed 0 there
    return Option("seed", default, SEED, "int | None", help_text, spec_default=0 if default is None else SAME)


# one typed object of run control for every family: what a method does not take keeps its default
RunControl = dataclasses.make_dataclass(
    "RunControl", [(o.name, o.annotation, field(default=o.default)) for o in RUN_CONTROL if o.api], kw_only=True
)
RunControl.__doc__ = "How and where a decomposition runs: " + ", ".join(o.name for o in RUN_CONTROL if o.api) + "."
