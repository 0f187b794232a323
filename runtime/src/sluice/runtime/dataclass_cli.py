"""Command-line flags declared once, as fields of a frozen dataclass.

`option(default, help, choices)` declares a field with its help text; `add_flags(parser,
cls)` turns every field into `--field-name` (bool fields become switches, `tuple[str, ...]`
fields take any number of values). Used by `ServerArgs`, `RouterArgs` and the benchmark's
`BenchArgs`. No heavy imports: the operator may import it.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, TypeVar

D = TypeVar("D")

_TYPES = {"int": int, "float": float, "str": str}


def option(
    default: Any, help: str, choices: tuple[str, ...] | None = None, repeatable: bool = False
) -> Any:
    """A flag; `repeatable` (a `tuple[str, ...]` field): `--flag a b --flag c` gives (a, b, c)."""
    meta = {"help": help, "choices": choices, "repeatable": repeatable}
    return dataclasses.field(default=default, metadata=meta)


def add_flags(
    parser: argparse.ArgumentParser, cls: type, only: tuple[str, ...] | None = None
) -> None:
    """`--field-name` for every field of `cls` (or only the fields named in `only`)."""
    for f in dataclasses.fields(cls):
        if only is not None and f.name not in only:
            continue
        flag = "--" + f.name.replace("_", "-")
        help_text = f.metadata["help"]
        if f.type in ("bool", bool):
            parser.add_argument(flag, action="store_true", help=help_text)
            continue
        if str(f.type) == "tuple[str, ...]" and f.metadata.get("repeatable"):
            parser.add_argument(
                flag, nargs="+", action="extend", type=str, default=None, metavar="VALUE",
                help=help_text,
            )
            continue
        if str(f.type) == "tuple[str, ...]":
            parser.add_argument(
                flag, nargs="*", type=str, default=f.default, metavar="VALUE", help=help_text
            )
            continue
        parser.add_argument(
            flag,
            type=_TYPES[str(f.type)],
            default=f.default,
            choices=f.metadata["choices"],
            help=f"{help_text} (default: {f.default!r})",
        )


def flags_of(obj: Any, only: tuple[str, ...] | None = None) -> list[str]:
    """The command-line flags that give `obj` (a dataclass `add_flags` parses) its values:
    one per field that differs from its default (only the fields named in `only`)."""
    out: list[str] = []
    for f in dataclasses.fields(obj):
        if only is not None and f.name not in only:
            continue
        value = getattr(obj, f.name)
        if value == f.default:
            continue
        flag = "--" + f.name.replace("_", "-")
        if f.type in ("bool", bool):
            if not value:  # a store_true flag cannot say False
                raise ValueError(f"{flag} defaults to True: no flag turns it off")
            out.append(flag)
        elif str(f.type) == "tuple[str, ...]":
            out += [flag, *value] if value else []
        else:
            out += [flag, str(value)]
    return out


def fields_by_name(cls: type[D], source: Any) -> D:
    """The dataclass `cls` with each field read by name from `source` (a larger record, such
    as the server's parsed flags); `source` itself when it already is a `cls`."""
    if isinstance(source, cls):
        return source
    return cls(**{f.name: getattr(source, f.name) for f in dataclasses.fields(cls)})  # type: ignore[arg-type]
