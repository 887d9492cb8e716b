"""A draft whose tokenizer files are byte-identical to the target's is not loaded again to
be checked; any difference sends it through the full check."""

from specdec.tokenization import same_tokenizer_files

from tiny import tiny_tokenizer


def test_identical_files_are_the_same_tokenizer_and_any_change_is_not(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    tiny_tokenizer().save_pretrained(a)
    tiny_tokenizer().save_pretrained(b)
    assert same_tokenizer_files(a, b)
    config = b / "tokenizer_config.json"
    config.write_text(config.read_text().replace("}", ', "x": 1}', 1))
    assert not same_tokenizer_files(a, b)
    (b / "tokenizer_config.json").unlink()  # a file one side lacks
    assert not same_tokenizer_files(a, b)
    assert not same_tokenizer_files(tmp_path / "empty", tmp_path / "empty2")
