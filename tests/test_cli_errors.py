# Bad input to the front door gets one clear line on stderr and a non-zero exit,
# never a traceback.
import json

import pytest
import serial

from host import flash
from vboard_util import kv, one_line_error, start


def test_unknown_board():
    r = kv("flash", "--board", "esp32s3_nonexistent")
    assert one_line_error(r) and r.returncode == 2 and "unknown board 'esp32s3_nonexistent'" in r.stderr, r.stderr


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda d: d.pop("memory"), "memory"),
        (lambda d: d["memory"][1].update(bytes="8M"), "memory[1].bytes"),
        (lambda d: d["cpu"].update(cores=0), "cpu.cores"),
        (lambda d: d.update(usb={"vid": "303A", "pid": "0x1001"}), "usb.vid"),
        (lambda d: d.pop("micropython_heap_bytes"), "micropython_heap_bytes"),
    ],
)
def test_malformed_profile_names_file_and_field(tmp_path, mutate, field):
    from host import paths

    d = json.load(open(paths.BOARDS + "/esp32s3_n8r8.json"))
    mutate(d)
    bad = tmp_path / "bad_board.json"
    bad.write_text(json.dumps(d))
    r = kv("flash", "--board", str(bad))
    assert one_line_error(r) and r.returncode == 2, r.stderr
    assert str(bad) in r.stderr and field + ":" in r.stderr, r.stderr


def test_profile_that_is_not_json(tmp_path):
    bad = tmp_path / "b.json"
    bad.write_text("{ this is not json")
    r = kv("vboard", "--board", str(bad))
    assert one_line_error(r) and r.returncode == 2 and "not valid JSON" in r.stderr, r.stderr


def test_missing_port():
    r = kv("flash", "--port", "/dev/ttyACM99")
    assert one_line_error(r) and r.returncode == 2 and "no serial port at /dev/ttyACM99" in r.stderr, r.stderr


def test_busy_port(tmp_path):
    with start(tmp_path) as vb:
        holder = serial.Serial(vb.port, exclusive=True)
        try:
            r = kv("flash", "--port", vb.port)
            assert one_line_error(r) and "busy" in r.stderr, r.stderr
            r = kv("monitor", "--port", vb.port, "--timeout", "2")
            assert one_line_error(r) and "busy" in r.stderr, r.stderr
        finally:
            holder.close()


def test_firmware_image_that_does_not_exist():
    r = kv("flash-firmware", "--bin", "/nonexistent/micropython.bin", "--port", "/dev/null")
    assert one_line_error(r) and r.returncode == 2 and "does not exist" in r.stderr, r.stderr


def test_firmware_image_that_is_not_an_esp_image(tmp_path):
    f = tmp_path / "x.bin"
    f.write_bytes(b"PK\x03\x04 not firmware")
    r = kv("flash-firmware", "--bin", str(f), "--port", "/dev/null")
    assert one_line_error(r) and r.returncode == 2 and "not an ESP32 firmware image" in r.stderr, r.stderr


def test_vboard_refuses_a_soc_profile():
    r = kv("vboard", "--board", "rk3588_4gb")
    assert one_line_error(r) and r.returncode == 2 and "not a microcontroller" in r.stderr, r.stderr


def test_unknown_benchmark():
    r = kv("bench", "nosuch")
    assert one_line_error(r) and r.returncode == 2 and "no benchmark 'nosuch'" in r.stderr, r.stderr


def test_esptool_command_for_an_esp32s3(tmp_path):
    cmds = flash.esptool_command("fw.bin", "/dev/ttyACM0", erase=True)
    assert [c[3:] for c in cmds][0][:2] == ["--chip", "esp32s3"]
    assert cmds[0][-1] == "erase-flash"
    w = cmds[1]
    assert w[1:3] == ["-m", "esptool"] and w[w.index("--chip") + 1] == "esp32s3"
    assert w[w.index("--port") + 1] == "/dev/ttyACM0" and w[w.index("--before") + 1] == "usb-reset"
    assert w[-4:] == ["write-flash", "-z", "0x0", "fw.bin"]


def test_esptool_accepts_the_command_it_is_given(tmp_path):
    # esptool parses our argv and gets as far as talking to the port: against a port
    # with no ESP32 ROM bootloader it fails to connect, and we say so in one line
    img = tmp_path / "fw.bin"
    img.write_bytes(b"\xe9" + bytes(4095))
    with start(tmp_path) as vb:
        r = kv("flash-firmware", "--bin", str(img), "--port", vb.port, timeout=300)
    assert r.returncode == 1 and "esptool failed" in r.stderr.splitlines()[-1], r.stderr[-2000:]
    assert "write-flash" in r.stdout and "Traceback" not in r.stderr
