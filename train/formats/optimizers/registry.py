"""The optimizer table: what an entry is (`Entry`), how one is registered (`register`), and
the generic section every entry reads (`OptimizerConfig`).

An entry owns its name (`--config.optimizer.name`), its frozen options dataclass (the
config's sub-section `--config.optimizer.<name>.<field>`, absent for an entry with no
options of its own), its builder, and the checks and evaluation point that differ from the
plain rule. Everything that depends on which optimizer a run uses asks its entry
(`OptimizerConfig.entry`); nothing else names one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import ml_collections
import optax

from train.core.failures import fail

# A schedule of the run's shape (warm-up, then `--config.schedule`) reaching `peak` at the
# end of warm-up; None: the run's own peak (`--config.learning_rate`).
Rate = Callable[[float | None], optax.Schedule]


@dataclasses.dataclass(frozen=True)
class Entry:
    """One optimizer of the table.

    Attributes:
        name: its `--config.optimizer.name`.
        build: `(section, options, rate) -> optax.GradientTransformation`: the update rule
            on `rate(None)` (and `rate(peak)` for a part with a peak of its own).
        options: its frozen options dataclass (fields with defaults; `__post_init__`
            checks them and names them with `option_error`), or None.
        check: `section -> None`, raising for generic fields this rule takes otherwise
            (schedule-free's b1 is its interpolation), or None.
        check_run: `(section, schedule, fine_tuning) -> None`, raising for a schedule or a
            run from pretrained weights this rule does not take, or None.
        evaluation_params: `(opt_state, params) -> params` where the point to evaluate is
            not the state's params (schedule-free), else None. Jittable.
        takes_groups: whether fine-tuning's parameter groups may split it.
    """

    name: str
    build: Callable[[Any, Any, Rate], optax.GradientTransformation]
    options: type | None = None
    check: Callable[[Any], None] | None = None
    check_run: Callable[[Any, Any, bool], None] | None = None
    evaluation_params: Callable[[Any, Any], Any] | None = None
    takes_groups: bool = True


# Every --config.optimizer.name, in registration order (`train.formats.optimizers` imports
# the modules that register them).
OPTIMIZERS: dict[str, Entry] = {}


def register(entry: Entry) -> Entry:
    """Adds `entry` to the table (a module's one registration line) and returns it."""
    if entry.name in OPTIMIZERS:
        raise ValueError(f"optimizer {entry.name!r} is registered twice.")
    OPTIMIZERS[entry.name] = entry
    return entry


def option_error(optimizer: str, field: str, value: Any, expected: str) -> ValueError:
    """The error for a bad option: `--config.optimizer.<optimizer>.<field>=<value>: ...`."""
    return fail(f"optimizer.{optimizer}.{field}", value, expected)


def is_real(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def config_section(name: str) -> ml_collections.ConfigDict:
    """`config.optimizer` of a config file: `name`, and one sub-section per entry with
    options, at their defaults (override them after, e.g. `.muon.learning_rate`)."""
    section = ml_collections.ConfigDict({"name": name})
    for entry in OPTIMIZERS.values():
        if entry.options is not None:
            section[entry.name] = ml_collections.ConfigDict(dataclasses.asdict(entry.options()))
    return section


def _options(entry: Entry, fields: Mapping[str, Any] | None) -> Any:
    """The entry's options from its config sub-section (a field it lacks, in a config.json
    older than the field, takes the default)."""
    if entry.options is None:
        return None
    fields = fields or {}
    return entry.options(
        **{f.name: fields[f.name] for f in dataclasses.fields(entry.options) if f.name in fields}
    )


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """Global-norm clipping, then the update rule `name` names, with the generic fields;
    gradient accumulation; for fine-tuning, parameter groups frozen or trained at a lower
    rate (`train.formats.optimizers.make_optimizer`).

    Attributes:
        name: a registered optimizer (`--config.optimizer.name`).
        b1, b2, eps, weight_decay: Adam's (an entry documents how it reads them).
        grad_clip_norm, grad_accum_steps, freeze, pretrained_lr_scale: the config fields of
            the same names. `freeze` and `pretrained_lr_scale` take effect with
            `--config.init_from` (`train.program.finetune` gives each parameter its group).
        options: the entry's own options (`--config.optimizer.<name>`), or None.
    """

    name: str
    b1: float
    b2: float
    eps: float
    weight_decay: float
    grad_clip_norm: float
    grad_accum_steps: int
    freeze: str = ""
    pretrained_lr_scale: float = 1.0
    options: Any = None

    # The top-level config fields every optimizer reads.
    GENERIC: ClassVar[tuple[str, ...]] = (
        "b1",
        "b2",
        "eps",
        "weight_decay",
        "grad_clip_norm",
        "grad_accum_steps",
        "freeze",
        "pretrained_lr_scale",
    )

    @classmethod
    def from_config(cls, config: ml_collections.ConfigDict) -> OptimizerConfig:
        """The section of `config.optimizer` (name and the entry's sub-section) and the
        generic top-level fields; a generic field the config lacks takes its default."""
        name = config.optimizer.name
        defaults = {f.name: f.default for f in dataclasses.fields(cls)}
        generic = {f: config[f] if f in config else defaults[f] for f in cls.GENERIC}
        options = None
        if name in OPTIMIZERS:
            options = _options(OPTIMIZERS[name], config.optimizer.get(name))
        return cls(name=name, options=options, **generic)

    @property
    def entry(self) -> Entry:
        """The registered entry of `name`."""
        return OPTIMIZERS[self.name]

    def check_run(self, schedule: Any, fine_tuning: bool) -> None:
        """The entry's checks of the schedule and of a run from pretrained weights."""
        if self.entry.check_run is not None:
            self.entry.check_run(self, schedule, fine_tuning)

    def __post_init__(self):
        if self.name not in OPTIMIZERS:
            raise fail("optimizer.name", self.name, f"must be one of {tuple(OPTIMIZERS)}")
        grad_accum = self.grad_accum_steps
        if not isinstance(grad_accum, int) or isinstance(grad_accum, bool) or grad_accum < 1:
            raise fail("grad_accum_steps", grad_accum, "must be a positive integer")
        for field in ("b1", "b2", "eps", "weight_decay", "grad_clip_norm"):
            if getattr(self, field) < 0:
                raise fail(field, getattr(self, field), "must be non-negative")
        if not is_real(self.pretrained_lr_scale) or not 0 <= self.pretrained_lr_scale <= 1:
            raise fail(
                "pretrained_lr_scale",
                self.pretrained_lr_scale,
                "must be in [0, 1]: the pretrained parameters' share of the learning rate",
            )
        entry = OPTIMIZERS[self.name]
        if entry.options is not None and not isinstance(self.options, entry.options):
            object.__setattr__(self, "options", entry.options())
        if entry.check is not None:
            entry.check(self)
