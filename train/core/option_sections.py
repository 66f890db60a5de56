"""Option sections that plug-ins own: each entry of a table (a corpus reader, a task) may
declare a frozen dataclass of options, and the config holds one sub-section per entry,
`--config.<field>.<section>.<option>` (e.g. `--config.corpora.hf.dataset=wmt14`,
`--config.tasks.dpo.beta=0.1`).

`config_section` makes the config's section from the table (so that a new entry's options
need no line in a config file); `read_sections` reads it back, checked, as one frozen,
hashable value (`OptionSections`) that the run's data section holds; `changed_options` lists
what a resumed run changed. Nothing here knows a corpus or a task: the tables are handed in.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any, ClassVar

import ml_collections

from train.core.failures import fail


class OptionSections:
    """Every options section of a table, read from the config (frozen, hashable).

    `options.hf` is the 'hf' section's dataclass. Subclasses name where the sections live
    (`FIELD`, the config field) and what owns them (`OWNER`, for errors).
    """

    FIELD: ClassVar[str] = "options"
    OWNER: ClassVar[str] = "entry"
    __slots__ = ("_sections",)

    def __init__(self, sections: Mapping[str, Any]):
        object.__setattr__(self, "_sections", tuple(sorted(sections.items())))

    def __getattr__(self, name: str) -> Any:
        for section, options in object.__getattribute__(self, "_sections"):
            if section == name:
                return options
        raise AttributeError(f"no {self.OWNER} options section {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self._sections == other._sections

    def __hash__(self) -> int:
        return hash(self._sections)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({dict(self._sections)!r})"

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """The sections as plain dicts (the config's section)."""
        return {name: dataclasses.asdict(options) for name, options in self._sections}


def read_sections(
    kind: type[OptionSections], sections: Mapping[str, type], config: Mapping[str, Any] | None
) -> OptionSections:
    """The options of every section in `sections` from the config's `kind.FIELD` section (a
    section or field it lacks takes its default).

    Raises:
        ValueError: an option out of range (the dataclass's own check), or a field that no
            section has (naming `--config.<FIELD>.<section>.<field>` and the fields it has).
    """
    config = dict(config or {})
    read = {}
    for name, options_type in sections.items():
        given = dict(config.pop(name, None) or {})
        known = {f.name for f in dataclasses.fields(options_type)}
        for field in sorted(set(given) - known):
            raise fail(
                f"{kind.FIELD}.{name}.{field}",
                given[field],
                f"is not an option; it has {sorted(known)}",
            )
        read[name] = options_type(**given)
    for name in sorted(config):
        raise fail(
            f"{kind.FIELD}.{name}",
            config[name],
            f"no {kind.OWNER} has options {name!r}; the sections are {sorted(sections)}",
        )
    return kind(read)


def config_section(sections: Mapping[str, type]) -> ml_collections.ConfigDict:
    """The config's section of a table: one sub-section per options dataclass, at its
    defaults (override them after, e.g. `config.corpora.hf.dataset = 'wmt14'`)."""
    return ml_collections.ConfigDict(
        {name: dataclasses.asdict(options_type()) for name, options_type in sections.items()}
    )


def changed_options(
    field: str, sections: Mapping[str, type], old: Mapping[str, Any], new: Mapping[str, Any]
) -> list[str]:
    """The options (`<field>.<section>.<option>`) that differ between two configs' sections,
    an option a section lacks (a config.json older than it) counting as its default, and
    those that only say how the data is read (the dataclass's `READING`, e.g.
    `corpora.text.in_memory`) left out."""
    changed = []
    for section, kind in sections.items():
        reading = getattr(kind, "READING", ())
        for f in dataclasses.fields(kind):
            if f.name in reading:
                continue
            before = (old.get(section) or {}).get(f.name, f.default)
            after = (new.get(section) or {}).get(f.name, f.default)
            if json.dumps(before, sort_keys=True) != json.dumps(after, sort_keys=True):
                changed.append(f"{field}.{section}.{f.name}")
    return changed
