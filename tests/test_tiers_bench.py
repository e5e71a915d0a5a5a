# `./kv bench tiers` (host/bench/tiers.py) on a short run: deterministic, its keys, aware
# never worse than unaware for audio, misses that come from the modelled mechanism (a
# PSRAM transfer in flight, the DMA queue holding Wi-Fi bursts while the cooperative decode
# holds the CPU), the decode's piece option, and a clear line when the model is absent.
import json

import pytest

from firmware_py import bandwidth as bwm
from firmware_py import board, dma, workloads
from firmware_py.clock import VirtualClock
from firmware_py.sched import Kernel
from host.bench import tiers
from host.errors import UserError

SHORT = 32  # tokens

try:
    tiers.model_files()
    HAVE_MODEL = True
except UserError:
    HAVE_MODEL = False
needs_model = pytest.mark.skipif(not HAVE_MODEL, reason="stories260K.bin / tok512.bin not in ../shared/models")

KEYS = ("audio_deadline_misses_aware", "audio_deadline_misses_unaware", "decode_ms_per_token_aware",
        "decode_ms_per_token_unaware", "psram_utilization_aware", "psram_utilization_unaware",
        "audio_worst_latency_us_aware", "audio_worst_latency_us_unaware", "wifi_mbit_s_aware", "wifi_mbit_s_unaware",
        "wifi_throttled_waits_aware", "decode_slowdown_aware", "decode_slowdown_unaware", "decode_ms_per_token_alone",
        "audio_periods", "decode_ms_per_token_shared_floor_aware", "audio_deadline_misses_unaware_no_wifi",
        "decode_longest_slice_us_unaware")


@pytest.fixture(scope="module")
def short():
    return tiers.measure(SHORT, sweep=False)


@needs_model
def test_deterministic_and_keys(short):
    again = tiers.measure(SHORT, sweep=False)
    assert json.dumps(short, sort_keys=True) == json.dumps(again, sort_keys=True)
    for k in KEYS:
        assert k in short, k
    assert short["tokens"] == SHORT
    assert short["audio_periods"] > 40  # ~0.9 s of virtual time at 16 ms
    assert short["same_tokens_aware"] and short["same_tokens_unaware"]  # the decode's text does not change
    lines = tiers.render(short)
    assert any(line.startswith("| audio deadline misses |") for line in lines)


@needs_model
def test_aware_no_more_misses(short):
    assert short["audio_deadline_misses_aware"] <= short["audio_deadline_misses_unaware"]
    assert short["audio_deadline_misses_unaware"] > 0
    assert short["audio_deadline_misses_aware"] == 0
    assert short["audio_deadline_misses_unaware_no_wifi"] == 0
    assert short["decode_longest_slice_us_aware"] < short["decode_longest_slice_us_unaware"]
    assert short["audio_worst_latency_us_aware"] < short["audio_config"]["deadline_us"]
    # the decode is slowed only by the co-runners' bytes on the tier (and its pieces' latencies)
    assert 1.0 <= short["decode_slowdown_aware"] < 1.05


@needs_model
def test_misses_come_from_wifi_bursts_queued_while_the_decode_holds_the_cpu():
    m, t = tiers.model_files()
    # the decode alone beside the audio: on a short context two of its stretches without a
    # yield (the audio's start, then its burst's landing by the engine task) stay inside the
    # deadline, so no miss (near the end of 512 tokens they do not: docs/tiers.md)
    no_wifi = tiers.scenario(m, t, SHORT, wifi=False)
    assert no_wifi["audio"]["misses"] == 0
    assert 0 < no_wifi["audio"]["worst_start_us"] < no_wifi["audio"]["deadline_us"]
    # with Wi-Fi's bursts in the one DMA queue: each burst ahead of the audio's waits for the
    # decode's next yield before it can start, and holds the PSRAM while it runs
    un = tiers.scenario(m, t, SHORT)
    assert un["audio"]["misses"] > 0
    assert un["dma"]["max_depth"] == tiers.QUEUE["slots"]  # the ring was full of Wi-Fi packets
    assert un["psram_stalls"] > 0  # the decode's reads found the tier busy with a DMA burst


def test_audio_dma_delayed_past_its_deadline_by_a_psram_transfer_in_flight():
    brd = board.load("boards/esp32s3_n8r8.json")
    out = {}
    for big in (0, 1048576):
        k = Kernel(VirtualClock(), max_tasks=6, verbose=False)
        bw = bwm.Bandwidth(brd, kernel=k)
        q = dma.DMAQueue(k, bw=bw, board=brd)
        sr, ps = bw.tier_id("sram"), bw.tier_id("psram")
        a = workloads.AudioCapture(k, q, sr, ps, bw.add_category("audio"), slots=4)
        k.spawn("audio", 7, a.task())
        q.spawn(6)
        end = []

        def master(k=k, bw=bw, ps=ps, big=big, end=end):
            yield k.sleep_until(15000)  # 1 ms before the first release
            if big:  # another bus master's transfer on PSRAM: holds the tier, not the CPU
                end.append(15000 + bw.occupy(ps, bwm.K_DMA, big))

        k.spawn("master", 5, master())
        k.run(16000 * 3 + 100)
        out[big] = (a.stats(), end, bw)
    st0 = out[0][0]
    assert st0["misses"] == 0 and st0["periods"] == 3
    own = st0["worst_latency_us"]  # the audio's own DMA: descriptor fetch + copy
    st, end, bw = out[1048576]
    assert end[0] - 16000 > 16000  # the transfer in flight outlasts the first period's deadline
    assert st["misses"] == 1 and st["lost"] == 0  # the task ran on time; its DMA waited for the tier
    assert st["worst_latency_us"] == end[0] - 16000 + own
    # the task itself ran on time: only the next period waited, for this move to land
    assert st["worst_start_us"] == st["worst_latency_us"] - 16000
    assert bw.report()["psram"]["all"]["stalls"] >= 1


@needs_model
def test_decode_pieces_change_time_not_bytes():
    m, t = tiers.model_files()
    whole = tiers.scenario(m, t, SHORT, audio=False, wifi=False)
    split = tiers.scenario(m, t, SHORT, piece=4096, audio=False, wifi=False)
    assert split["text_ids_sum"] == whole["text_ids_sum"]
    assert split["psram_bytes"] == whole["psram_bytes"]
    assert split["decode_pieces"] > 5 * SHORT
    extra = split["decode_us"] - whole["decode_us"]
    # each piece is a transfer of its own: one more first-access latency (330 ns) per piece,
    # nothing lost to rounding (the sub-µs parts are carried)
    assert 0 <= extra <= split["decode_pieces"]
    assert split["psram_utilization"] == 1.0


def test_model_absent_is_one_line(tmp_path):
    with pytest.raises(UserError) as e:
        tiers.model_files(str(tmp_path))
    assert e.value.code != 0
    assert "\n" not in str(e.value) and "stories260K.bin" in str(e.value)
    with pytest.raises(UserError):
        tiers.measure(SHORT, model_dir=str(tmp_path))
