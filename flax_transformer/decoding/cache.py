"""The generation cache's old place: it now lives in `flax_transformer.cache`, below the
models that read and write it. Every name stays importable from here for code written
against this path."""

from flax_transformer.cache import (
    cache_length,
    check_cache_kind,
    check_cache_room,
    init_cache,
    init_decoder_cache,
    move_rows,
    select_rows,
)

__all__ = [
    "cache_length",
    "check_cache_kind",
    "check_cache_room",
    "init_cache",
    "init_decoder_cache",
    "move_rows",
    "select_rows",
]
