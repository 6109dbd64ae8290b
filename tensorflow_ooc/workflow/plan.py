"""A validated spec planned into a :class:`Workflow`: locations resolved and confined, references and
inputs checked, outputs kept apart from inputs, steps in dependency order (:func:`load_spec`)."""

from __future__ import annotations

import fnmatch
import hashlib
import importlib.util
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from . import locations as loc
from .errors import Problem, SpecError
from .optional_packages import install_hint
from .sandbox import ALLOW_ENV, _resolve, config_path, confined, default_storage, operator_allow_paths, real_location
from .secret_values import secret_patterns as secret_patterns_of
from .spec_source import Source, _display, read_source, validate_source
from .step_models import CP_RESULT_METHODS, EXPORT_NEEDS, Spec, _Step


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
    root = loc.normalize(storage or spec.storage or default_storage())
    operator = list(operator or [])
    allowed = _sandbox(spec, src, root, operator, problems)
    planned = _locate_steps(spec, src, root, allowed, problems)
    _find_dependencies(spec, planned)
    cycle = _find_cycle(list(spec.steps), {s.name: s.deps for s in planned})
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
        _missing_inputs(planned, src, problems)
        _export_problems(planned, src, problems)
    if problems:
        problems = src.annotate(problems)
        problems.sort(key=lambda p: p.line or 0)
        raise SpecError(src.path, problems)
    name = spec.name or os.path.splitext(os.path.basename(src.path))[0].replace(".yaml", "") or "workflow"
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", name)
    return Workflow(
        spec,
        src,
        name,
        root,
        allowed,
        _dependency_order(planned),
        hashlib.sha256(src.record_text.encode()).hexdigest(),  # of what the record keeps: no secret in it
        [a for a, _ in operator],
    )


def _sandbox(spec: Spec, src: Source, root: str, operator: list[tuple[str, str]], problems: list[Problem]) -> list[str]:
    """The folders this spec may use: the storage root, and the spec's ``allow_paths`` where each
    lies inside what the operator allows (else all the operator allows)."""
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
    return allowed


def _locate_steps(spec: Spec, src: Source, root: str, allowed: list[str], problems: list[Problem]) -> list[PlannedStep]:
    """Every step's inputs and outputs resolved and confined to ``allowed``; one writer per output."""
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
                    blocker = _file_on_the_way(location)
                    if blocker is not None:
                        problems.append(
                            Problem(
                                src.line(where),
                                _display(where),
                                f"output {location} goes through {blocker}, which is a file, not a folder: "
                                "nothing can be written there (name another path, or move the file)",
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
    return planned


def _file_on_the_way(location: str) -> str | None:
    """The existing ancestor of a local ``location`` that is a file rather than a folder, if any
    (writing the output would fail with FileExistsError or NotADirectoryError on every try)."""
    if loc.is_url(location):
        return None
    path = os.path.abspath(location)
    parent = os.path.dirname(path)
    while parent != path:
        if os.path.lexists(parent):
            return None if os.path.isdir(parent) else parent
        path, parent = parent, os.path.dirname(parent)
    return None


def _find_dependencies(spec: Spec, planned: list[PlannedStep]) -> None:
    """Each step's ``deps``: its explicit ``after`` plus every step whose output it reads."""
    # dependencies: explicit 'after' plus every step whose output this step reads
    for st in planned:
        deps = [d for d in st.model.after if d in spec.steps]
        for location in st.inputs.values():
            for other in planned:
                if other.name != st.name and _produces(other, location) and other.name not in deps:
                    deps.append(other.name)
        st.deps = deps


def _missing_inputs(planned: list[PlannedStep], src: Source, problems: list[Problem]) -> None:
    """Inputs that no step makes must exist now (a glob's folder, for a glob)."""
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


def _export_problems(planned: list[PlannedStep], src: Source, problems: list[Problem]) -> None:
    """Exports known not to work before anything runs: pyttb of a non-CP result, a missing package."""
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
                        f"format {fmt!r} needs the {need} package: {install_hint(need)}",
                    )
                )


def _dependency_order(planned: list[PlannedStep]) -> list[PlannedStep]:
    """Steps in dependency order, declaration order among independent steps."""
    order: list[PlannedStep] = []
    done: set[str] = set()
    while len(order) < len(planned):
        for st in planned:
            if st.name not in done and all(d in done for d in st.deps):
                order.append(st)
                done.add(st.name)
                break
    return order


def load_spec(
    path: str | os.PathLike | None = None,
    *,
    text: str | None = None,
    storage: str | None = None,
    allow_paths: list[str] | tuple[str, ...] | None = None,
    operator_config: bool = True,
    overrides: Sequence[str] = (),
    interpolate: bool = True,
    variables: Mapping[str, str] | None = None,
    secret_patterns: Sequence[str] | None = None,
    secret_values: Sequence[str] = (),
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
        ``steps.decompose.rank=32`` (:func:`apply_override`); ``NAME=VALUE`` with an upper-case
        ``NAME`` sets the variable ``${NAME}`` instead (``RUN_DATE=2026-11-20``).
    interpolate : bool
        Replace ``${VAR}`` and ``${VAR:-default}`` in values from the environment
        (:func:`interpolate_value`); False for a text resolved already (a submitted driver's,
        which must not depend on the worker's environment).
    variables : mapping, optional
        Variables over the environment's for ``${NAME}`` (``tfooc run --run-date`` sets
        ``RUN_DATE``).
    secret_patterns : sequence of str, optional
        Name patterns of secret variables added to the defaults and ``$TFOOC_SECRET_PATTERNS``
        (``tfooc run --secret-pattern``; :func:`~.secret_values.secret_patterns`).
    secret_values : sequence of str
        Values to mask besides the secret variables' (a submitted driver gets those of the spec
        it runs, which was resolved where it was submitted).

    Returns
    -------
    Workflow

    Raises
    ------
    SpecError
        Naming the file, line and field of every problem found.
    """
    operator = operator_allow_paths(allow_paths, environment=operator_config)
    patterns = secret_patterns_of(secret_patterns, environment=operator_config)
    src = read_source(
        path,
        text,
        overrides=overrides,
        interpolate=interpolate,
        variables=variables,
        patterns=patterns,
        secret_values=secret_values,
    )
    try:
        spec = validate_source(src)
        return plan(spec, src, storage, operator)
    except SpecError as exc:  # a message quoting a secret value (a path, a wrong value) shows it masked
        if not src.secret_values:
            raise
        mask = src.mask
        raise SpecError(exc.path, [Problem(p.line, p.field, mask.text(p.message)) for p in exc.problems]) from None


def spec_schema() -> dict:
    """The JSON Schema of a workflow spec (:func:`.json_schema.spec_schema`)."""
    from .json_schema import spec_schema as schema

    return schema()
