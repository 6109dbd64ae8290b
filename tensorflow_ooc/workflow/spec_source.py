"""A spec's YAML source: read safely with its line numbers, bounded in size and expansion, its ``${VAR}``
references and ``--set`` overrides applied, then validated into a :class:`~.step_models.Spec` with
errors that name the file, line and field."""

from __future__ import annotations

import datetime
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml
from pydantic import (
    ValidationError,
)

from . import locations as loc
from .errors import Problem, SpecError
from .secret_values import MASKED, Mask, is_secret, secret_patterns
from .step_models import (
    _METHOD_OF,
    DECOMPOSE_METHODS,
    DECOMPOSE_MODELS,
    STEP_KINDS,
    STEP_MODELS,
    STEP_TAGS,
    Spec,
    _step_tag,
)


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
    #: the spec as the run record keeps it: resolved as ``resolved_text``, except that references to
    #: secret variables stay ``${NAME}`` (None: the file's text)
    recorded_text: str | None = None
    #: the values of the secret variables the spec used (masked wherever the run writes)
    secret_values: tuple[str, ...] = ()
    #: the run date, ``${RUN_DATE}`` (``YYYY-MM-DD``)
    run_date: str | None = None

    @property
    def record_text(self) -> str:
        """The spec as the run record keeps it (secret values never in it)."""
        return self.recorded_text if self.recorded_text is not None else self.text

    @property
    def mask(self) -> Mask:
        """What keeps this spec's secret values out of records, events and logs."""
        return Mask(self.secret_values)

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


class SpecLoader(yaml.SafeLoader):
    """PyYAML's safe loader, reading ``1e-6`` as the float it is (YAML 1.1, which PyYAML follows,
    wants ``1.0e-6``: ``tol: 1e-6`` was the text '1e-6')."""


SpecLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


#: an upper-case ``--set NAME=VALUE`` sets the variable ``${NAME}`` (the spec's own keys are lower case)
_VARIABLE_NAME = re.compile(r"[A-Z][A-Z0-9_]*")

#: the run date variable: today unless given (``--set RUN_DATE=...``, ``--run-date``, the environment)
RUN_DATE = "RUN_DATE"

_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


def split_overrides(overrides: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """``--set`` entries split into spec overrides (``dotted.path=VALUE``) and variables
    (``NAME=VALUE`` with an upper-case ``NAME``: ``--set RUN_DATE=2026-11-20``)."""
    settings, variables = [], {}
    for given in overrides:
        name, eq, value = given.partition("=")
        if eq and _VARIABLE_NAME.fullmatch(name.strip()):
            variables[name.strip()] = value
        else:
            settings.append(given)
    return settings, variables


def run_date(value: str | None, where: str, spec_name: str = "<string>") -> str:
    """The run date: ``value`` checked as ``YYYY-MM-DD`` (a :class:`SpecError` naming ``where``
    otherwise), else today's date on this machine."""
    if value is None or value == "":
        return datetime.date.today().isoformat()
    try:
        if not _DATE.fullmatch(value):
            raise ValueError("not YYYY-MM-DD")
        datetime.date.fromisoformat(value)
    except ValueError:
        raise SpecError(
            spec_name, [Problem(None, where, f"expected a date as YYYY-MM-DD (2026-11-20), got {value!r}")]
        ) from None
    return value


# a reference inside a flow collection ({rank: ${RANK:-16}}) would close the collection at its '}':
# YAML reads the text with each reference swapped for a plain token, and the token is swapped back
_SHIELDED = re.compile(r"\$\$\{|\$\{[^}\n]*\}")


def _shield(text: str) -> tuple[str, dict[str, str]]:
    """``text`` with each ``${...}`` replaced by a unique plain token of (at least) its length, and
    the tokens' originals; lines and most columns stay where they were."""
    marker = next(m for m in ("$Q", "$QQ", "$QQQ", "$QQQQ") if m not in text)
    tokens: dict[str, str] = {}

    def swap(m: re.Match) -> str:
        if m.group(0) == "$${":
            return m.group(0)
        token = f"{marker}{len(tokens)}"
        token = token + "_" * max(0, len(m.group(0)) - len(token) - 1) + "$"
        tokens[token] = m.group(0)
        return token

    return _SHIELDED.sub(swap, text), tokens


def _unshield(node: yaml.Node, tokens: dict[str, str]) -> None:
    """Put the references :func:`_shield` swapped out back into every scalar (keys too)."""
    seen: set[int] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        if isinstance(n, yaml.MappingNode):
            stack.extend(x for kv in n.value for x in kv)
        elif isinstance(n, yaml.SequenceNode):
            stack.extend(n.value)
        elif isinstance(n, yaml.ScalarNode) and "$" in n.value:
            for token, original in tokens.items():
                if token in n.value:
                    n.value = n.value.replace(token, original)


def _marked_secrets(node: yaml.Node) -> list[str]:
    """The variable names a spec's top-level ``secrets`` lists (read before substitution)."""
    if not isinstance(node, yaml.MappingNode):
        return []
    for k, v in node.value:
        if isinstance(k, yaml.ScalarNode) and k.value == "secrets" and isinstance(v, yaml.SequenceNode):
            return [item.value for item in v.value if isinstance(item, yaml.ScalarNode)]
    return []


def read_source(
    path: str | os.PathLike | None = None,
    text: str | None = None,
    *,
    overrides: Sequence[str] = (),
    environ: Mapping[str, str] | None = None,
    interpolate: bool = True,
    variables: Mapping[str, str] | None = None,
    patterns: Sequence[str] | None = None,
    secret_values: Sequence[str] = (),
) -> Source:
    """Read and safe-load a spec; YAML errors become a :class:`SpecError` with the line.

    ``${VAR}``, ``${VAR:-default}`` and ``${VAR-default}`` in values are replaced from ``environ``
    (default ``os.environ``; see :func:`interpolate_value`) with ``variables`` over it (``--set
    NAME=VALUE`` entries of ``overrides`` too) and ``${RUN_DATE}`` today's date unless given, unless
    ``interpolate`` is false (a text that was resolved already), then each other ``overrides`` entry
    ``dotted.path=VALUE`` is applied (:func:`apply_override`).

    Variables named in the spec's ``secrets`` list or matching one of ``patterns`` (default
    :func:`~.secret_values.secret_patterns`) are secret: their values are in ``data`` but not in
    ``recorded_text``, which keeps their ``${NAME}``, and are listed in ``secret_values`` (with
    those given for an already resolved text) for the run to mask."""
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
    settings, set_variables = split_overrides(overrides)
    env: dict[str, str] = dict(os.environ if environ is None else environ)
    env.update(variables or {})
    env.update(set_variables)
    given_date = (
        ("--set RUN_DATE", set_variables[RUN_DATE])
        if RUN_DATE in set_variables
        else ("RUN_DATE (the environment's or --run-date)", env[RUN_DATE])
        if env.get(RUN_DATE)
        else (RUN_DATE, None)
    )
    # a text resolved already (a submitted driver's) has its date in it: the worker's is not checked
    env[RUN_DATE] = run_date(given_date[1], given_date[0], name) if interpolate else given_date[1] or ""
    patterns = secret_patterns() if patterns is None else tuple(patterns)
    used: dict[str, str] = {}
    loader = None
    shielded, tokens = _shield(text)
    try:
        loader = SpecLoader(shielded)  # refuses control characters (a ReaderError) here already
        node = loader.get_single_node()
        changed, shown = False, {}
        marked: list[str] = []

        def secret(var: str) -> bool:
            return is_secret(var, patterns, marked)

        if node is not None:
            _check_expansion(node)
            if tokens:
                _unshield(node, tokens)
            marked.extend(_marked_secrets(node))
            if interpolate:
                env_problems: list[Problem] = []
                changed, shown = interpolate_node(node, loader, env, env_problems, secret=secret, used=used)
                if env_problems:
                    raise SpecError(name, env_problems)
                secret_values = (*secret_values, *(v for k, v in used.items() if secret(k)))
        data = loader.construct_document(node) if node is not None else None
        recorded = data
        if shown:  # the same document with the secret references kept, for the record
            for n, value in shown.values():
                n.value, n.tag = value, "tag:yaml.org,2002:str"
            recorded = loader.construct_document(node)
    except RecursionError:
        raise SpecError(name, [Problem(None, None, "the YAML is nested too deeply to be a workflow spec")]) from None
    except yaml.MarkedYAMLError as exc:
        # the context mark is where the broken construct starts (an unclosed '[' or a key missing
        # its ':'); the problem mark is where the parser gave up, often the next line or the end
        mark = exc.context_mark or exc.problem_mark
        what = " ".join(s for s in (exc.context, exc.problem) if s)
        if exc.context_mark and exc.problem_mark and exc.problem_mark.line != exc.context_mark.line:
            what += f" (on line {exc.problem_mark.line + 1})"
        for token, original in tokens.items():
            what = what.replace(token, original)
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
    mask = Mask(secret_values)
    src = Source(name, text, data, marks, secret_values=tuple(mask.values), run_date=env[RUN_DATE] or None)
    for given in settings:
        field_name = apply_override(data, given, name)
        if recorded is not data:
            apply_override(recorded, given, name)
        src.overrides[field_name] = given
    if changed or settings:
        shown_sets = [f"--set {o}" for o in settings] + [
            f"--set {k}={MASKED if secret(k) or mask.text(v) != v else v}" for k, v in set_variables.items()
        ]
        what = ", ".join((["environment variables substituted"] if changed else []) + shown_sets)
        src.resolved_text = f"# {name}, resolved ({what})\n" + yaml.safe_dump(
            data, sort_keys=False, default_flow_style=False, allow_unicode=True
        )
        kept = sorted(k for k in used if any(v == used[k] for v in mask.values))
        note = f"; secret variables kept as ${{NAME}}: {', '.join(kept)}" if kept else ""
        src.recorded_text = mask.text(
            f"# {name}, resolved ({what}{note})\n"
            + yaml.safe_dump(recorded, sort_keys=False, default_flow_style=False, allow_unicode=True)
        )
    elif mask:
        src.recorded_text = mask.text(text)
    return src


# "$${" is a literal "${"; "${BODY}" a reference; a "${" left without its "}" is an error
_REFERENCE = re.compile(r"\$\$\{|\$\{([^}]*)\}|\$\{")


_REFERENCE_BODY = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(?:(:?-)(.*))?", re.DOTALL)


def interpolate_value(
    value: str,
    environ: Mapping[str, str],
    *,
    keep: Callable[[str], bool] | None = None,
    used: dict[str, str] | None = None,
) -> tuple[str, list[str]]:
    """``value`` with its ``${VAR}`` references replaced, and what is wrong with them.

    References to a variable for which ``keep`` is true stay as written (the record's copy of a
    secret); ``used`` collects each variable substituted, with its value.

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
        if keep is not None and keep(var):
            return m.group(0)
        got = environ.get(var)
        if op == ":-" and not got:
            got = default
        elif op == "-" and got is None:
            got = default
        if got is None:
            errors.append(f"environment variable {var} is not set (set it, or give a default: ${{{var}:-DEFAULT}})")
            return m.group(0)
        if used is not None:
            used[var] = got
        return got

    return _REFERENCE.sub(replace, value), errors


def interpolate_node(
    node: yaml.Node,
    loader: yaml.SafeLoader,
    environ: Mapping[str, str],
    problems: list[Problem],
    *,
    secret: Callable[[str], bool] | None = None,
    used: dict[str, str] | None = None,
) -> tuple[bool, dict[int, tuple[yaml.ScalarNode, str]]]:
    """Replace ``${VAR}`` references (:func:`interpolate_value`) in the values of a composed YAML
    document, in place; return whether any value changed, and for each value that holds a
    reference to a ``secret`` variable, its node and its text with those references kept (what
    the run record shows). ``used`` collects the variables substituted. Keys are left as they are.

    A plain (unquoted) value is typed again after the substitution, as YAML types what is written
    in the file: ``rank: ${RANK:-16}`` is the integer 16, ``tol: ${TOL}`` with ``TOL=1e-6`` a
    float. A quoted value stays a string. Each problem has the line and the dotted field."""
    changed = False
    shown: dict[int, tuple[yaml.ScalarNode, str]] = {}
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
            value, errors = interpolate_value(n.value, environ, used=used)
            problems.extend(Problem(n.start_mark.line + 1, _display(where) or None, e) for e in errors)
            if secret is not None and not errors:
                kept = interpolate_value(n.value, environ, keep=secret)[0]
                if kept != value:
                    shown[id(n)] = (n, kept)
            if value != n.value:
                changed = True
                if n.style is None and n.tag == loader.resolve(yaml.ScalarNode, n.value, (True, False)):
                    n.tag = loader.resolve(yaml.ScalarNode, value, (True, False))
                n.value = value
    problems.sort(key=lambda p: p.line or 0)
    return changed, shown


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
        value = yaml.load(raw, Loader=SpecLoader) if raw.strip() else None  # noqa: S506 - a safe loader
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
