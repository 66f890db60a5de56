"""The corpora's own options: each reader module that has options of its own defines them as
a frozen dataclass in its `OPTIONS` (section name -> dataclass), and the config holds one
sub-section per entry, `--config.corpora.<section>.<field>` (e.g.
`--config.corpora.hf.dataset=wmt14`), made from the table by `config_section` so that a new
reader's options need no line in a config file.

The run reads them as one frozen value, `CorpusOptions` (`DataConfig.corpora`): the reader
of a corpus asks for its section by name (`data.corpora.hf.dataset`), and nothing above the
corpora names their fields.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import ml_collections

from train.core.failures import fail

# Where the options live in the config: --config.corpora.<section>.<field>.
CONFIG_FIELD = "corpora"


def option_error(section: str, field: str, value: Any, expected: str) -> ValueError:
    """The error for a bad option: `--config.corpora.<section>.<field>=<value>: expected`."""
    return fail(f"{CONFIG_FIELD}.{section}.{field}", value, expected)


class CorpusOptions:
    """Every options section of the corpus table, read from the config (frozen, hashable).

    `options.hf` is the 'hf' section's dataclass; a section the config lacks (a config.json
    older than it) takes its defaults.
    """

    __slots__ = ("_sections",)

    def __init__(self, sections: Mapping[str, Any]):
        object.__setattr__(self, "_sections", tuple(sorted(sections.items())))

    def __getattr__(self, name: str) -> Any:
        for section, options in object.__getattribute__(self, "_sections"):
            if section == name:
                return options
        raise AttributeError(f"no corpus options section {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CorpusOptions) and self._sections == other._sections

    def __hash__(self) -> int:
        return hash(self._sections)

    def __repr__(self) -> str:
        return f"CorpusOptions({dict(self._sections)!r})"

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """The sections as plain dicts (the config's `corpora` section)."""
        return {name: dataclasses.asdict(options) for name, options in self._sections}


def read_options(sections: Mapping[str, type], config: Mapping[str, Any] | None) -> CorpusOptions:
    """The options of every section in `sections` from the config's `corpora` section.

    Raises:
        ValueError: an option out of range, or a field that no section has (naming
            `--config.corpora.<section>.<field>` and the fields it has).
    """
    config = dict(config or {})
    read = {}
    for name, options_type in sections.items():
        given = dict(config.pop(name, None) or {})
        known = {f.name for f in dataclasses.fields(options_type)}
        for field in sorted(set(given) - known):
            raise option_error(
                name, field, given[field], f"is not an option; it has {sorted(known)}"
            )
        read[name] = options_type(**given)
    for name in sorted(config):
        raise fail(
            CONFIG_FIELD + "." + name,
            config[name],
            f"no corpus has options {name!r}; the sections are {sorted(sections)}",
        )
    return CorpusOptions(read)


def config_section(sections: Mapping[str, type]) -> ml_collections.ConfigDict:
    """`config.corpora` of a config file: one sub-section per options dataclass, at its
    defaults (override them after, e.g. `config.corpora.hf.dataset = 'wmt14'`)."""
    return ml_collections.ConfigDict(
        {name: dataclasses.asdict(options_type()) for name, options_type in sections.items()}
    )
