# The committed scenarios (scenarios/*.json) are valid application configs
# (firmware_py/appcfg.py) with a title and a comment of what they model, and the
# emulator's scenario loader refuses a bad file in one line.
import json
import os

import pytest

from firmware_py import appcfg
from host import emulate
from host.errors import UserError

NAMES = emulate.scenario_names()


def test_the_four_scenarios_exist():
    assert {"voice-assistant", "sensor-gateway", "two-chats", "long-generation"} <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_scenario_is_a_valid_config(name):
    p = os.path.join(emulate.SCENARIOS, name + ".json")
    with open(p) as f:
        raw = json.load(f)
    cfg = appcfg.load(json.dumps(raw))
    assert cfg["name"] == name and cfg["title"] and len(cfg["comment"]) > 40
    assert emulate.load_scenario(name)[1] == cfg


def test_scenario_loader_errors(tmp_path):
    p = tmp_path / "x.json"
    for text, word in (('{"emulate": {"boardd": "x"}}', "boardd"), ('{"tasks": [{"kind": "audio"}]}', "name"),
                       ("not json", "JSON")):
        p.write_text(text)
        with pytest.raises(UserError) as e:
            emulate.load_scenario(str(p))
        assert word in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(UserError):
        emulate.load_scenario("no-such-scenario")
