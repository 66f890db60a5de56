"""benchmarks/smollm2_peer.py's dtype axis: `--dtypes` read as OURS:THEIRS pairs, a bad
entry refused before any worker starts (the benchmark itself runs SmolLM2 for minutes and
is run by hand)."""

import pytest

from benchmarks.smollm2_peer import main, parse_dtypes


def test_dtypes_are_pairs_and_a_single_dtype_means_both_sides():
    assert parse_dtypes("float32") == ["float32:float32"]
    assert parse_dtypes("float32,auto:bfloat16,bfloat16") == [
        "float32:float32",
        "auto:bfloat16",
        "bfloat16:bfloat16",
    ]


@pytest.mark.parametrize("entry", ["float16", "auto", "float32:auto", "bf16:float32"])
def test_a_dtype_a_side_cannot_compute_in_is_refused_naming_the_entry(entry, capsys):
    with pytest.raises(SystemExit, match=f"--dtypes entry '{entry}'"):
        main(["--parts", "train", "--dtypes", entry])
    assert capsys.readouterr().out == ""  # refused before the machine line or a worker
