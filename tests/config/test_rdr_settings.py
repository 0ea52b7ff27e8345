"""resolve_rdr: config.json's "rdr" wins over MS_RDR_* per field; bad values name the field."""
import os

import pytest

from rankscope.config.msprobe import ConfigError
from rankscope.config.rdr import RdrSettings, resolve_rdr


def test_disabled_by_default():
    assert resolve_rdr(None, env={}) == RdrSettings(enable=False, mode=1, path=None)


def test_env_only(tmp_path):
    s = resolve_rdr(None, env={"MS_RDR_ENABLE": "1", "MS_RDR_MODE": "2", "MS_RDR_PATH": str(tmp_path)})
    assert s == RdrSettings(enable=True, mode=2, path=str(tmp_path))


def test_config_wins_over_env_field_by_field(tmp_path):
    env = {"MS_RDR_ENABLE": "0", "MS_RDR_MODE": "2", "MS_RDR_PATH": "/from/env"}
    s = resolve_rdr({"enable": True, "mode": 1}, env=env)
    # enable and mode from the file, path still from the environment
    assert s == RdrSettings(enable=True, mode=1, path="/from/env")
    s = resolve_rdr({"enable": False}, env={"MS_RDR_ENABLE": "1"})
    assert s.enable is False
    s = resolve_rdr({"path": str(tmp_path)}, env=env)
    # env says disabled and the file does not enable it; path and mode still resolved
    assert s == RdrSettings(enable=False, mode=2, path=str(tmp_path))
    s = resolve_rdr({"enable": True, "path": str(tmp_path)}, env=env)
    assert s.path == str(tmp_path) and s.mode == 2


def test_enabled_without_path_defaults_to_absolute_cwd_rdr(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    s = resolve_rdr({"enable": True}, env={})
    assert os.path.isabs(s.path) and s.path == str(tmp_path / "rdr")


@pytest.mark.parametrize("section,env,field", [
    ({"enable": True, "path": "relative/dir"}, {}, "rdr.path"),
    ({"enable": True}, {"MS_RDR_PATH": "rel"}, "MS_RDR_PATH"),
    ({"enable": "yes"}, {}, "rdr.enable"),
    ({"mode": 3}, {}, "rdr.mode"),
    ({"mode": True}, {}, "rdr.mode"),
    (None, {"MS_RDR_MODE": "two"}, "MS_RDR_MODE"),
    (None, {"MS_RDR_ENABLE": "maybe"}, "MS_RDR_ENABLE"),
    ({"enabled": True}, {}, "rdr.enabled"),
])
def test_bad_values_name_the_field(section, env, field):
    with pytest.raises(ConfigError) as info:
        resolve_rdr(section, env=env)
    assert info.value.field == field
    assert field in str(info.value)
