"""The ``offcut`` commands' connection settings (offcut.client.settings): flag over
environment over config file over default, each flag generated from the settings model, and a
bad value, file key or file as one line naming where it came from, exit code 2."""

from __future__ import annotations

import os

import pytest

from offcut.client.settings import (FLAG_FIELDS, ClientSettings, SettingsError, flag_names,
                                    load_client_settings)

from test_cli_tasks import one_line_error, run


def _write(path, text: str):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_a_flag_beats_the_environment_which_beats_the_file(daemon, tmp_path, monkeypatch):
    """Each of the three sources, given a dead address under a live one's precedence, is
    overridden: the command reaches the live daemon; and the next source down is used when the
    one above is silent."""
    srv, _ = daemon
    dead = f"unix://{tmp_path}/dead.sock"
    config = _write(tmp_path / "xdg" / "offcut" / "client.toml",
                    f'address = "{dead}"\ncall_timeout_s = 7.5\n')
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    one_line_error(run("queue"), 1, dead)                       # the default file is read
    monkeypatch.setenv("OFFCUT_ADDRESS", srv.address)
    assert run("queue").exit_code == 0                          # env over file
    monkeypatch.setenv("OFFCUT_ADDRESS", dead)
    assert run("queue", "--address", srv.address).exit_code == 0   # flag over env
    assert run("status", "-a", srv.address).exit_code == 0
    monkeypatch.setenv("OFFCUT_ADDRESS", "")                    # empty = unset: the file's
    one_line_error(run("queue"), 1, dead)
    other = _write(tmp_path / "other.toml", f'address = "{srv.address}"\n')
    assert run("queue", "--config", str(other)).exit_code == 0  # --config instead of the default

    settings = load_client_settings({"call_timeout_s": None}, config)
    assert (settings.address, settings.call_timeout_s) == (dead, 7.5)  # None = flag not given
    monkeypatch.setenv("OFFCUT_CALL_TIMEOUT_S", "12")
    assert load_client_settings({}, config).call_timeout_s == 12.0
    assert load_client_settings({"call_timeout_s": 3.0}, config).call_timeout_s == 3.0
    monkeypatch.delenv("OFFCUT_CALL_TIMEOUT_S")
    monkeypatch.delenv("OFFCUT_ADDRESS")
    empty = _write(tmp_path / "empty.toml", "")
    assert load_client_settings({}, empty).model_dump() == {  # the defaults
        "address": None, "token": None, "token_file": None, "tls_ca": None,
        "tls_server_name": None, "munge_socket": None, "insecure_token": None,
        "call_timeout_s": 30.0, "retry_deadline_s": 0.0}


def test_the_settings_reach_the_client(tmp_path, monkeypatch):
    token_file = _write(tmp_path / "tok", "secret-token\n")
    os.chmod(token_file, 0o600)
    monkeypatch.setenv("OFFCUT_RETRY_DEADLINE_S", "5")
    settings = load_client_settings({"address": f"unix://{tmp_path}/s.sock",
                                     "token_file": token_file, "call_timeout_s": 4.0})
    with settings.client() as c:
        assert (c.address, c.timeout_s, c.authenticated) == (f"unix://{tmp_path}/s.sock", 4.0,
                                                             True)
        assert c.retry is not None and c.retry.deadline_s == 5.0
    monkeypatch.setenv("OFFCUT_TOKEN", "from-env")
    with load_client_settings({}).client() as c:
        assert c.authenticated and c.retry.deadline_s == 5.0
    monkeypatch.delenv("OFFCUT_RETRY_DEADLINE_S")
    with load_client_settings({}).client() as c:
        assert c.retry is None
    monkeypatch.setenv("HOME", str(tmp_path))  # a file's "~" is expanded (no shell did it)
    config = _write(tmp_path / "c.toml", 'token_file = "~/tok"\ntls_ca = "~/ca.pem"\n')
    settings = load_client_settings({}, config)
    assert (settings.token_file, settings.tls_ca) == (token_file, tmp_path / "ca.pem")


def test_every_setting_but_the_token_is_a_flag_of_every_connecting_command():
    assert "token" not in FLAG_FIELDS
    assert set(FLAG_FIELDS) == set(ClientSettings.model_fields) - {"token"}
    for command in ("submit", "queue", "show", "cancel", "watch", "status", "history"):
        text = run(command, "--help").stdout
        for name in FLAG_FIELDS:
            assert flag_names(name)[0] in text and f"OFFCUT_{name.upper()}" in text, (command,
                                                                                      name)
        assert "--config" in text and "--token " not in text


@pytest.mark.parametrize("variable,value,needle", [
    ("OFFCUT_CALL_TIMEOUT_S", "abc", "valid number"),
    ("OFFCUT_CALL_TIMEOUT_S", "0", "greater than 0"),
    ("OFFCUT_RETRY_DEADLINE_S", "-1", "greater than or equal to 0"),
    ("OFFCUT_RETRY_DEADLINE_S", "1e9", "less than or equal to 86400"),
    ("OFFCUT_ADDRESS", "unix:///a\tb", "printable"),
])
def test_a_bad_environment_value_is_one_line_naming_the_variable(monkeypatch, variable, value,
                                                                 needle):
    monkeypatch.setenv(variable, value)
    err = one_line_error(run("queue"), 2, f"${variable}: ", needle)
    assert "Traceback" not in err


def test_a_bad_flag_value_names_the_flag():
    one_line_error(run("queue", "--call-timeout-s", "0"), 2, "--call-timeout-s: ",
                   "greater than 0")
    one_line_error(run("status", "--retry-deadline-s", "-2"), 2, "--retry-deadline-s: ")


@pytest.mark.parametrize("text,needles", [
    ("call_timeout_s = -1\n", ["call_timeout_s: ", "greater than 0"]),
    ('call_timeout_s = "soon"\n', ["call_timeout_s: ", "valid number"]),
    ("retry_deadline_s = [1]\n", ["retry_deadline_s: "]),
    ('adress = "unix:///x.sock"\n', ["unknown key 'adress'", "known: address"]),
    ("[tls]\nca = 'x'\n", ["unknown key 'tls'"]),
    ('token = "s3cret"\n', ["token: not read from a file", "token_file"]),
    ("address = \n", ["not valid TOML"]),
])
def test_a_bad_file_key_or_value_is_one_line_naming_the_file_and_key(tmp_path, text, needles):
    config = _write(tmp_path / "client.toml", text)
    err = one_line_error(run("queue", "--config", str(config)), 2, f"config {config}",
                         *needles)
    assert "s3cret" not in err


def test_a_missing_config_file_is_an_error_only_when_named(tmp_path, monkeypatch):
    one_line_error(run("queue", "--config", str(tmp_path / "nope.toml")), 2,
                   f"cannot read config {tmp_path / 'nope.toml'}")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "none"))  # no default file: fine
    assert load_client_settings({}).call_timeout_s == 30.0
    with pytest.raises(SettingsError, match="unknown key"):
        load_client_settings({}, _write(tmp_path / "c.toml", "x = 1\n"))
