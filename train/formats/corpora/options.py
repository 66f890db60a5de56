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

from collections.abc import Mapping
from typing import Any

import ml_collections

from train.core import option_sections
from train.core.failures import fail
from train.core.option_sections import OptionSections, read_sections

# Where the options live in the config: --config.corpora.<section>.<field>.
CONFIG_FIELD = "corpora"


def option_error(section: str, field: str, value: Any, expected: str) -> ValueError:
    """The error for a bad option: `--config.corpora.<section>.<field>=<value>: expected`."""
    return fail(f"{CONFIG_FIELD}.{section}.{field}", value, expected)


class CorpusOptions(OptionSections):
    """Every options section of the corpus table, read from the config (frozen, hashable).

    `options.hf` is the 'hf' section's dataclass; a section the config lacks (a config.json
    older than it) takes its defaults.
    """

    FIELD = CONFIG_FIELD
    OWNER = "corpus"
    __slots__ = ()


def read_options(sections: Mapping[str, type], config: Mapping[str, Any] | None) -> CorpusOptions:
    """The options of every section in `sections` from the config's `corpora` section.

    Raises:
        ValueError: an option out of range, or a field that no section has (naming
            `--config.corpora.<section>.<field>` and the fields it has).
    """
    return read_sections(CorpusOptions, sections, config)


def config_section(sections: Mapping[str, type]) -> ml_collections.ConfigDict:
    """`config.corpora` of a config file: one sub-section per options dataclass, at its
    defaults (override them after, e.g. `config.corpora.hf.dataset = 'wmt14'`)."""
    return option_sections.config_section(sections)
