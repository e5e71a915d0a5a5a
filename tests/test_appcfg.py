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


def test_reserved_names_and_budgets():
    # every name the firmware or the emulator spawns is refused for a task and for a chat;
    # bandwidth budgets on one tier summing past 1000 permille are refused naming the tier
    for nm in appcfg.RESERVED:
        for cfg in ({"tasks": [{"kind": "sensor", "name": nm}]}, {"decode": {"chats": [{"name": nm}]}}):
            with pytest.raises(appcfg.AppConfigError) as e:
                appcfg.load(cfg)
            assert "reserved" in str(e.value) and nm in str(e.value) and "\n" not in str(e.value)
    assert {"decode", "prefix", "dma", "telemetry", "thermal", "end"} <= set(appcfg.RESERVED)
    two = {"tasks": [{"kind": "wifi", "name": "a", "budget_permille": 700},
                     {"kind": "wifi", "name": "b", "budget_permille": 700}]}
    with pytest.raises(appcfg.AppConfigError) as e:
        appcfg.load(two)
    assert "psram" in str(e.value) and "1400" in str(e.value) and "\n" not in str(e.value)
    two["tasks"][1]["budget_permille"] = 300
    assert len(appcfg.load(two)["tasks"]) == 2  # 1000 on psram: allowed
    two["tasks"][1]["src"] = "sram"
    two["tasks"][1]["budget_permille"] = 700
    assert len(appcfg.load(two)["tasks"]) == 2  # different tiers


def test_budget_sum_on_one_tier_at_spawn(tmp_path):
    # through the emulator: a role (wifi src) and a tier name (audio dst) on one tier, one line exit 2
    p = tmp_path / "b.json"
    p.write_text(json.dumps({"decode": {"tokens": 2}, "tasks": [
        {"kind": "wifi", "name": "a", "budget_permille": 700},
        {"kind": "audio", "name": "m", "dst": "psram", "budget_permille": 400}]}))
    with pytest.raises(UserError) as e:
        emulate.run({"scenario": str(p), "cost": "c"})
    assert "psram" in str(e.value) and e.value.code == 2 and "\n" not in str(e.value)


@pytest.mark.parametrize("key,value,ok", [("top_p", 0.0, False), ("top_p", 1e-4, True), ("top_p", 1.0, True),
                                          ("temperature", 1e6, True), ("temperature", 1e6 + 1, False),
                                          ("seed", 0xFFFFFFFF, True), ("seed", 1 << 32, False)])
def test_the_sampler_settings_have_one_range_in_every_front_end(key, value, ok):
    # the app config took top_p 0 (the sampler refuses it: the board failed at boot), its
    # temperature stopped at 10 and emulate's too where generate took 1e6, and the seeds
    # stopped at 2**30 - 1 where generate took 2**32 - 1: one range now (sample.py), and
    # the config, emulate and generate accept and refuse the same values, each in one line
    from firmware_py import sample
    from host import generate

    def cfg():
        appcfg.load({"decode": {key: value}})

    def emu():
        emulate.normalize({key: value})

    def gen():
        flag = {"top_p": "top_p", "temperature": "temperature", "seed": "seed"}[key]
        try:
            generate.main(model="/nonexistent.bin", **{flag: repr(value)})
        except UserError as e:
            if "nonexistent" in str(e) or "model" in str(e):
                return
            raise

    for f, err in ((cfg, appcfg.AppConfigError), (emu, UserError), (gen, UserError)):
        if ok:
            f()
        else:
            with pytest.raises(err) as e:
                f()
            assert key.replace("_", "") in str(e.value).replace("_", "").replace("-", "") and "\n" not in str(e.value)
    if ok:
        sample.Sampler(8, **{key: value})
    else:
        with pytest.raises(sample.SamplerError):
            sample.Sampler(8, **{key: value})
