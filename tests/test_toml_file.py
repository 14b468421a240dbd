"""The one TOML file reader (:mod:`offcut.toml_file`), without a daemon."""

from __future__ import annotations

import pytest

from offcut import toml_file
from offcut.toml_file import TomlFileError, read_toml


def test_a_good_file_is_its_table(tmp_path):
    path = tmp_path / "a.toml"
    path.write_text('address = "unix:///x.sock"\n[slurm]\nqueue = "q"\n')
    assert read_toml(path, "config") == {"address": "unix:///x.sock", "slurm": {"queue": "q"}}


def test_each_problem_names_the_file_and_where(tmp_path, monkeypatch):
    missing = tmp_path / "none.toml"
    with pytest.raises(TomlFileError, match=f"cannot read config {missing}: No such file"):
        read_toml(missing, "config")
    path = tmp_path / "bad.toml"
    path.write_text('a = 1\nb = \n')
    with pytest.raises(TomlFileError) as err:
        read_toml(path, "tokens file")
    assert str(err.value).startswith(f"tokens file {path}: not valid TOML: ")
    assert "line 2" in str(err.value)
    path.write_bytes(b'a = 1\nb = 2\nc = "\xff"\n')  # not UTF-8: an error, not a traceback
    with pytest.raises(TomlFileError, match=r"not UTF-8 \(at line 3\)"):
        read_toml(path, "config")
    monkeypatch.setattr(toml_file, "MAX_TOML_BYTES", 8)
    path.write_text("a = 1\nb = 2\n")
    with pytest.raises(TomlFileError, match="larger than 8 bytes"):
        read_toml(path, "config")


def test_the_check_sees_the_opened_file_and_may_refuse_it(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("a = 1\n")
    seen = []

    def check(st):
        seen.append(st.st_size)
        return "writable by others"

    with pytest.raises(TomlFileError, match=f"^config {path}: refused: writable by others$"):
        read_toml(path, "config", check=check)
    assert seen == [6]
    assert read_toml(path, "config", check=lambda st: None) == {"a": 1}
