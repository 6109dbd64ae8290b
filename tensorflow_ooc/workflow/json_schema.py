"""The JSON Schema of workflow specs (``tfooc schema``), from the pydantic models, made to accept
what ``tfooc validate`` accepts and to report errors at the field that is wrong:

- any value may be (or hold) a ``${VAR}`` reference, which ``validate`` substitutes before it
  checks the type (``rank: ${RANK:-16}`` is valid in both);
- a step is checked against its kind's model only (``kind``, and ``method`` for decompose, pick
  it, as pydantic's discriminator does), instead of a ``oneOf`` of every step model whose only
  error is "not valid under any of the given schemas".
"""

from __future__ import annotations

import copy
from typing import Any

from .step_models import DECOMPOSE_MODELS, STEP_KINDS, STEP_MODELS, Spec

SUBSTITUTION = "Substitution"

#: a string holding a ${NAME}, ${NAME:-default} or ${NAME-default} reference (JSON Schema patterns search)
REFERENCE_PATTERN = r"\$\{[A-Za-z_][A-Za-z0-9_]*(:?-[^}]*)?\}"

# kept as they are: a step's kind and method choose its model, so they are never substituted
_NOT_SUBSTITUTED = ("kind", "method")

_SHOWN = ("title", "description", "default")


def _substitutable(node: Any) -> Any:
    """``node`` with every property value and list item also accepting a ``${VAR}`` string."""
    if isinstance(node, list):
        return [_substitutable(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _substitutable(v) for k, v in node.items()}
    if isinstance(out.get("properties"), dict):
        out["properties"] = {
            name: sub if name in _NOT_SUBSTITUTED else _or_reference(sub) for name, sub in out["properties"].items()
        }
    if isinstance(out.get("items"), dict):
        out["items"] = _or_reference(out["items"])
    return out


def _or_reference(sub: dict) -> dict:
    if sub.get("type") == "string" and not ({"enum", "const", "pattern", "format"} & set(sub)):
        return sub  # any text: a reference is text already
    shown = {k: sub[k] for k in _SHOWN if k in sub}
    return {**shown, "anyOf": [sub, {"$ref": f"#/$defs/{SUBSTITUTION}"}]}


def _model_name(model: type) -> str:
    return model.__name__


def _step_choice() -> dict:
    """A step's schema: ``kind`` one of the kinds, then the model of its kind (and method)."""
    rules = []
    methods = {tag.removeprefix("decompose-"): model for tag, model in DECOMPOSE_MODELS.items() if tag != "decompose"}
    for kind, model in STEP_MODELS.items():
        if kind == "decompose":
            for method, m in methods.items():
                rules.append(
                    {
                        "if": {
                            "properties": {"kind": {"const": "decompose"}, "method": {"const": method}},
                            "required": ["kind", "method"],
                        },
                        "then": {"$ref": f"#/$defs/{_model_name(m)}"},
                    }
                )
            rules.append(
                {
                    "if": {
                        "properties": {"kind": {"const": "decompose"}, "method": {"not": {"enum": list(methods)}}},
                        "required": ["kind"],
                    },
                    "then": {"$ref": f"#/$defs/{_model_name(model)}"},
                }
            )
            continue
        rules.append(
            {
                "if": {"properties": {"kind": {"const": kind}}, "required": ["kind"]},
                "then": {"$ref": f"#/$defs/{_model_name(model)}"},
            }
        )
    return {
        "type": "object",
        "required": ["kind"],
        "properties": {"kind": {"enum": list(STEP_KINDS), "description": "what the step does"}},
        "allOf": rules,
    }


def spec_schema() -> dict:
    """The JSON Schema (draft 2020-12) of a workflow spec, from the pydantic models: for editors
    (YAML language servers) and for checking specs outside tfooc (``tfooc schema``).

    Returns
    -------
    dict
        Values may hold ``${VAR}`` references; each step is checked against its kind's model, so an
        error names the step's field (``steps.cp.rank``), not only the step.
    """
    schema = copy.deepcopy(Spec.model_json_schema())
    schema = _substitutable(schema)
    steps = schema["properties"]["steps"]
    inner = steps["anyOf"][0] if "anyOf" in steps else steps  # the steps mapping itself is never substituted
    schema["properties"]["steps"] = {**inner, "additionalProperties": _step_choice()}
    schema.setdefault("$defs", {})[SUBSTITUTION] = {
        "type": "string",
        "pattern": REFERENCE_PATTERN,
        "description": "a ${VAR}, ${VAR:-default} or ${VAR-default} reference, substituted from the environment "
        "(or --set VAR=VALUE) before the spec is checked",
    }
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "tfooc workflow spec",
        **{k: v for k, v in schema.items() if k != "title"},
    }


__all__ = ["REFERENCE_PATTERN", "spec_schema"]
