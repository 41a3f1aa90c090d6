from pathlib import Path

import pytest

from nerserve.ner.data import DataError, iter_file, label_set, read_split


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "train.jsonl"
    path.write_text(text, encoding="utf-8")
    return path


def test_real_splits_parse(data_root: Path) -> None:
    dev = read_split(data_root / "cadec", "dev")
    assert len(dev) == 1097
    assert any(e.is_discontinuous for s in dev for e in s.entities)
    assert label_set(read_split(data_root / "conll03", "dev", limit=500)) == ["LOC", "MISC", "ORG", "PER"]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "invalid JSON"),
        ('{"tokens": [], "entities": []}', "'tokens' must be a non-empty list"),
        ('{"tokens": ["a b"], "entities": []}', "without whitespace"),
        ('{"tokens": ["a"], "entities": [{"type": "X", "spans": [[0, 2]]}]}', "outside 0..1"),
        ('{"tokens": ["a", "b", "c"], "entities": [{"type": "X", "spans": [[0, 1], [1, 2]]}]}', "must not touch"),
        ('{"tokens": ["a"], "entities": [{"spans": [[0, 1]]}]}', "'type' must be"),
    ],
)
def test_bad_records_name_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    path = write(tmp_path, '{"tokens": ["ok"], "entities": []}\n' + line + "\n")
    with pytest.raises(DataError) as error:
        list(iter_file(path))
    assert str(error.value).startswith(f"{path}:2: ")
    assert message in str(error.value)


def test_missing_folder_and_split(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no such data folder"):
        read_split(tmp_path / "nope", "train")
    with pytest.raises(DataError, match="no such data file"):
        read_split(tmp_path, "dev")
    with pytest.raises(DataError, match="unknown split"):
        read_split(tmp_path, "validation")
