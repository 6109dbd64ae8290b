"""The table options of ``convert``, declared once: the API keywords, the CLI flags
(``tfooc convert --modes user,item,day --value count``) and the workflow convert step's keys are
built from these declarations. Nothing heavy is imported: the CLI builds its parser from it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

BUCKET_UNITS = ("second", "minute", "hour", "day", "week", "month", "year")
TABLE_FORMATS = ("parquet", "csv")
PARQUET_SUFFIXES = (".parquet", ".parq", ".pq")
CSV_SUFFIXES = (".csv", ".csv.gz", ".csv.bz2", ".csv.zst", ".tsv")
TABLE_SUFFIXES = PARQUET_SUFFIXES + CSV_SUFFIXES


def is_table_location(location: str) -> bool:
    """Whether a location names Parquet or CSV files by its suffix."""
    return str(location).lower().endswith(TABLE_SUFFIXES)


def parse_names(text: str) -> list[str]:
    """``user,item,day`` -> ``["user", "item", "day"]``."""
    names = [t.strip() for t in str(text).split(",")]
    if not names or any(not n for n in names):
        raise ValueError(f"expected column names separated by commas, got {text!r}")
    return names


def parse_buckets(text: str) -> dict[str, str]:
    """``day=day,ts=hour`` -> ``{"day": "day", "ts": "hour"}``."""
    out = {}
    for part in str(text).split(","):
        col, sep, unit = part.partition("=")
        if not sep or not col.strip() or unit.strip() not in BUCKET_UNITS:
            raise ValueError(f"expected COLUMN=UNIT pairs with UNIT one of {', '.join(BUCKET_UNITS)}, got {part!r}")
        out[col.strip()] = unit.strip()
    return out


@dataclass(frozen=True)
class TableOption:
    """One table option: its API keyword (also the spec key, unless ``spec`` is False), CLI flag,
    the one help text, how the CLI's text becomes the value, and its choices."""

    name: str
    flag: str
    help: str
    parse: Callable[[str], Any] = str
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    spec: bool = True


TABLE_OPTIONS = (
    TableOption(
        "modes",
        "--modes",
        "the input is a table (Parquet or CSV: a file, a folder, a glob, an s3:// URL): its key columns, one per "
        "mode in order (e.g. user,item,day); keys (strings, integers, dates, categories) are numbered in order of "
        "first appearance and kept in the store as label dictionaries",
        parse_names,
        metavar="COLUMNS",
    ),
    TableOption(
        "value",
        "--value",
        "a table's value column (numbers); without one each row counts one (with duplicates sum: the number of "
        "rows of each coordinate)",
        metavar="COLUMN",
    ),
    TableOption(
        "bucket",
        "--bucket",
        "floor date or timestamp modes to a unit before they become keys, as COLUMN=UNIT pairs (e.g. day=day or "
        f"ts=hour; units {', '.join(BUCKET_UNITS)})",
        parse_buckets,
        metavar="COLUMN=UNIT",
    ),
    TableOption(
        "table_format",
        "--table-format",
        "the table files' format (default: from their suffix, .parquet or .csv)",
        choices=TABLE_FORMATS,
    ),
    TableOption(
        "append_to",
        "--append-to",
        "a store converted from a table: its nonzeros come first, its keys keep their indices and new keys get "
        "the next ones (the modes grow, never renumber), so warm starts line up",
        metavar="STORE",
        spec=False,
    ),
)


def table_option(name: str) -> TableOption:
    return next(o for o in TABLE_OPTIONS if o.name == name)
