# One option layer (host/options.py): every command parses a whole number, a number or a
# time the same way and refuses it in the same one line (exit 2). Before it, six parsers
# said six things: `--tokens x` was "a whole number" in emulate and generate, "a whole
# number >= 1" in demo, "wants whole numbers" in sweep; emulate and generate took
# full-width digits ("４") and budget refused them; emulate's range said "tokens", not
# "--tokens".
import pytest

from host import options
from host.errors import UserError
from vboard_util import kv, one_line_error


def test_whole_and_number():
    assert options.whole("12", "--n", 1, 20) == 12 and options.whole(-1, "--r", -1) == -1
    assert options.number("0.5", "--p", 0.0, 1.0, open_lo=True) == 0.5 and options.seconds("2", "--t") == 2.0
    for bad in ("x", "", " 5", "1_0", "\uff14", "0x10", True, "1e3", "21", "0"):
        with pytest.raises(UserError) as e:
            options.whole(bad, "--n", 1, 20)
        assert e.value.code == 2 and str(e.value).startswith("--n ") and "\n" not in str(e.value)
    for bad in ("nan", "inf", "", "x", "0", "1.5", "\uff10.5", True):
        with pytest.raises(UserError) as e:
            options.number(bad, "--p", 0.0, 1.0, open_lo=True)
        assert e.value.code == 2 and str(e.value).startswith("--p must be a number in (0, 1]") or "needs a value" in str(e.value)
    with pytest.raises(UserError):
        options.seconds("0", "--timeout")
    with pytest.raises(UserError):
        options.choice("x", "--policy", ("full", "window"))


TOKENS = [("emulate",), ("generate",), ("demo",), ("budget",)]


@pytest.mark.parametrize("cmd", TOKENS, ids=lambda c: c[0])
@pytest.mark.parametrize("value", ["x", "\uff14", "1_0"])
def test_every_command_refuses_a_bad_token_count_in_the_same_words(cmd, value):
    r = kv(*cmd, "--tokens", value)
    assert one_line_error(r) and r.returncode == 2, (cmd, r.stdout[-300:], r.stderr)
    assert "--tokens must be a whole number" in r.stderr and (value == "\uff14") == ("in ASCII digits 0-9, got" in r.stderr), r.stderr


def test_a_range_names_the_flag():
    r = kv("emulate", "--tokens", "0")
    assert one_line_error(r) and "--tokens must be a whole number in 1..1048576, got 0" in r.stderr, r.stderr
    r = kv("generate", "--top-p", "0")
    assert one_line_error(r) and "--top-p must be a number in (0, 1], got '0'" in r.stderr, r.stderr
    for cmd in ("emulate", "generate"):
        r = kv(cmd, "--temperature", "-1")
        assert one_line_error(r) and "--temperature must be a number in [0, 1e+06], got '-1'" in r.stderr, r.stderr


@pytest.mark.parametrize("text", [" 5 ", "1_0", "inf", "-nan", "0x10", "1.2.3", "\uff15", "5e", ""])
def test_a_number_is_typed_in_ascii_digits_a_point_and_an_exponent(text):
    with pytest.raises(UserError) as e:
        options.number(text, "--top-p", 0.0, 10.0)
    assert "--top-p" in str(e.value) and e.value.code == 2


@pytest.mark.parametrize("text,value", [("5", 5.0), ("+.5", 0.5), ("5.", 5.0), ("1e-1", 0.1), ("-0", 0.0)])
def test_the_numbers_a_user_types_are_taken(text, value):
    assert options.number(text, "--x", -1.0, 10.0) == value
