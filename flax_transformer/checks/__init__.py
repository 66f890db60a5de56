"""The library's input checks, in one place: each raises one error naming the value, what
was expected and the fix, before any compute is spent (docs/api.md, "Errors").

  arguments   the checks of plain arguments every floor uses: arrays (`as_array`), dtypes,
              numbers and ints in range, per-feature parameter widths (`check_param_width`),
              activation widths (`check_model_width`), `is_concrete`, `is_int`
  traced      checks of traced values: `runtime_check` stages them as checkify checks
              (`TransformerConfig.debug_checks`), `checked(fn)` jits and raises them
  tokens      the models' token inputs: `check_tokens`, `check_token_range`, packing
              (`check_packing`, `check_segment_ids`, `check_positions`)
  generation  the generation functions' inputs (lengths, eos_id, rng, logits_hook, prompt
              lengths) and `unbox_params`, the variables check `train/` shares

The package is the library's ground floor: it imports nothing of the library but itself, so
every other floor may use it (tests/test_layering.py holds it there). `arguments`, `traced`
and `tokens` import jax and numpy only, so that `functional` (which never imports flax) can
use them; `generation` imports flax. This package's `__init__` imports none of them. A
strategy's own checks stay with it (`decoding.strategies`: `Strategy.check`,
`check_strategy`); `TransformerConfig` checks its fields in `config`.
"""
