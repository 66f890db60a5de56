"""The checks every config section makes of its fields, each failure one line naming the field
as it is written on the command line (`train.core.failures.fail`), and the reading of a section
from the config fields of the same names.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import ml_collections

from train.core.failures import fail


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_real(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def check_positive_ints(section, *names: str) -> None:
    for name in names:
        value = getattr(section, name)
        if not is_int(value) or value < 1:
            raise fail(name, value, "must be a positive integer")


def check_non_negative_ints(section, *names: str) -> None:
    for name in names:
        value = getattr(section, name)
        if not is_int(value) or value < 0:
            raise fail(name, value, "must be a non-negative integer")


def check_choice(section, name: str, allowed: tuple) -> None:
    if getattr(section, name) not in allowed:
        raise fail(name, getattr(section, name), f"must be one of {allowed}")


def check_non_negative(section, *names: str) -> None:
    for name in names:
        if getattr(section, name) < 0:
            raise fail(name, getattr(section, name), "must be non-negative")


def check_fraction(section, name: str) -> None:
    """A share in [0, 1)."""
    if not 0.0 <= getattr(section, name) < 1.0:
        raise fail(name, getattr(section, name), "must be in [0, 1)")


class ReadByName:
    """A section whose fields are config fields of the same names."""

    @classmethod
    def from_config(cls, config: ml_collections.ConfigDict):
        """The section made from the config's fields of the same names (checked when made); a
        field with a default that the config lacks (a config.json older than the field) takes
        the default."""
        return cls(
            **{
                f.name: config[f.name]
                if f.name in config or f.default is dataclasses.MISSING
                else f.default
                for f in dataclasses.fields(cls)
            }
        )
