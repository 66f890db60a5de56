"""The special token ids every tokenizer of the program shares, and the vocabulary a model is
built for: plain values that config/, data/ and the tasks all read."""

# Special ids shared by every tokenizer. Pad is 0 because the model masks id 0 (config.pad_id).
PAD_ID = 0
BOS_ID = 1
EOS_ID = 2
UNK_ID = 3
NUM_SPECIAL_IDS = 4
# The byte tokenizer's pieces: byte b has id b + NUM_SPECIAL_IDS.
NUM_BYTES = 256


def model_vocab_size(kind: str, vocab_size: int) -> int:
    """The vocabulary a model is built for: the byte tokenizer's, or `vocab_size`.

    Args:
        kind: the data section's `tokenizer` ('byte' or 'sentencepiece').
        vocab_size: the data section's `vocab_size` (the pieces sentencepiece trains).
    """
    return NUM_SPECIAL_IDS + NUM_BYTES if kind == "byte" else vocab_size
