# The heap a decoding firmware keeps free after its boot, as measured: what runs after
# the pool is made (one decode step, the telemetry task, the config's tasks, a GC cycle)
# allocates, and the boot's sizing (decode.Session, sizing "boot") keeps that much free.
# The figures are not tuned to a benchmark: `./kv heapmargin` (host/heapmargin.py) boots
# the decoding firmware under each interpreter and word size, eats the free heap with
# ballast until only X bytes are left, runs the part, and finds by bisection the least X
# with which it runs without a MemoryError: on the 2 MB board's heap, one prompt, a full
# policy, greedy and temperature-0.8 sampling on the integer path (int8 weights and KV),
# greedy with one new token on the float path (fp32; its telemetry and tasks parts are the
# integer path's); the tasks are voice-assistant's. Each figure is the most over the
# draws, with the spread (most - least). Not measured: int4 KV, ring policies' eviction.
# The GC cycle itself allocates nothing from the heap (MicroPython's collector marks
# with a fixed stack in its own state), so its part is what the parts' garbage needs
# between collections, which the ballast runs include.
#
# TABLE[(word_bytes, path)][part] = (bytes, spread); path "q8": the integer path (int8
# weights and int8 KV on MicroPython), "plain": the float path
GENERATED = "host/heapmargin.py"  # what writes this file
PARTS = ("decode", "telemetry", "tasks")  # what Session(margin_for=...) may name
GC_BLOCKS = 2  # + this many GC blocks per part: the rounding of the largest live object it allocates
# The gc part: free heap kept beyond the measured needs so that garbage does not force a
# collection of the whole heap every few KB. Chosen, not measured: the float path
# allocates a float per operation (with only its live need free, one token of
# stories260K took 18 s on the unix port), the integer path allocates nothing per step
GC_HEADROOM = {"q8": 4096, "plain": 32768}

TABLE = {
    (4, "q8"): {"decode": (3072, 256), "telemetry": (7168, 1280), "tasks": (1536, 1024)},
    (4, "plain"): {"decode": (3072, 0), "telemetry": (7168, 1280), "tasks": (1536, 1024)},
    (8, "q8"): {"decode": (6912, 768), "telemetry": (9728, 1280), "tasks": (3584, 2560)},
    (8, "plain"): {"decode": (7680, 0), "telemetry": (9728, 1280), "tasks": (3584, 2560)},
}
# What the boot measures, for the calculator to predict it (decode.predict_boot): per word
# size, path and context, "residual": the firmware's own heap before the model's run state
# (modules, tokenizer, objects: heap - free - weights), "holes": the free heap outside
# the largest piece at the probe, "model_extra": the run state's bytes beyond the shapes
# of its arrays (model.run_state_fixed_bytes); each (most, spread) over the boards'
# heaps; measured with a model of "vocab" tokens (the residual scales by
# decode.TOKEN_BYTES per token for another). Contexts (CONTEXTS): "decode" is
# decode.Session booted by itself from the source modules (tools/kvprobe.py, the rows
# `./kv bench budget` checks); "serve" is a flashed board's own boot (tools/serveprobe.py:
# the board's files in one folder, .mpy modules, main.py's boot report, then serve.main),
# "serve+tasks" the same with a config's tasks (voice-assistant's) in kvrtos.json
FOOTPRINT = {
    (4, "q8"): {"decode": {"residual": (252448, 64), "holes": (16789, 566), "model_extra": (5356, 4)}, "serve": {"residual": (312736, 128), "holes": (13470, 1050), "model_extra": (5344, 0)}, "serve+tasks": {"residual": (344048, 288), "holes": (16622, 1427), "model_extra": (5360, 16)}},
    (4, "plain"): {"decode": {"residual": (234192, 272), "holes": (11251, 112), "model_extra": (1120, 0)}, "serve": {"residual": (294672, 176), "holes": (32485, 1693), "model_extra": (1120, 0)}, "serve+tasks": {"residual": (325808, 112), "holes": (38115, 12509), "model_extra": (1120, 0)}},
    (8, "q8"): {"decode": {"residual": (375104, 448), "holes": (19514, 4970), "model_extra": (10612, 4)}, "serve": {"residual": (457920, 448), "holes": (12624, 86), "model_extra": (10600, 0)}, "serve+tasks": {"residual": (496800, 1088), "holes": (13344, 850), "model_extra": (10600, 0)}},
    (8, "plain"): {"decode": {"residual": (352192, 256), "holes": (11138, 1176), "model_extra": (2336, 0)}, "serve": {"residual": (434560, 256), "holes": (24775, 7316), "model_extra": (2336, 0)}, "serve+tasks": {"residual": (474048, 992), "holes": (15143, 1337), "model_extra": (2336, 0)}},
}
VOCAB = 512  # vocabulary of the model the footprints were measured with
# bytes the calculator takes off the free heap and again off its largest piece beyond the
# measured figures: the firmware's own heap and the holes move a little with its code
# (a few hundred bytes of changed source moved the holes by 3.7 KB before the entry
# scripts collected their imports' garbage as it came); kept below one int8 block of
# stories260K (7,808 B) so the boot stays within one block of the prediction
ALLOWANCE = 2048
SOURCE = "./kv heapmargin --write on 2026-12-07 (esp32s3_n4r2 heap, draws t=0.0, t=0.8, 8 layouts; the float path: its decode greedy, 2 layouts, the other parts the integer path's; + 512 B for the layouts not tried)"  # the command and date of the figures
# what runs after the boot in each context: the parts of the margin it keeps
CONTEXTS = {"decode": ("decode",), "serve": ("decode", "telemetry"), "serve+tasks": ("decode", "telemetry", "tasks")}


# (margin B, ((part, bytes, spread), ...)) on an interpreter of word_bytes words running
# the integer path (q8) or the float one, for the parts named in `parts` (PARTS), the
# gc headroom first when any part runs; ValueError for a part that is not measured
def margin(word_bytes, q8, parts=("decode",)):
    path = "q8" if q8 else "plain"
    row = TABLE[(4 if word_bytes == 4 else 8, path)]
    total = 0
    out = []
    if parts:  # whatever runs, the collector's headroom
        total = GC_HEADROOM[path]
        out.append(("gc", total, 0))
    for p in parts:
        if p not in row:
            raise ValueError("heap margin: no measured part %r (want %s)" % (p, ", ".join(PARTS)))
        b, spread = row[p]
        b += GC_BLOCKS * 4 * word_bytes
        out.append((p, b, spread))
        total += b
    return total, tuple(out)


# {"residual", "holes", "model_extra": bytes (the most measured), "vocab"} of the boot in
# context (CONTEXTS); ValueError for another
def footprint(word_bytes, q8, context="decode"):
    row = FOOTPRINT[(4 if word_bytes == 4 else 8, "q8" if q8 else "plain")]
    if context not in row:
        raise ValueError("heap footprint: no measured context %r (want %s)" % (context, ", ".join(CONTEXTS)))
    f = row[context]
    return {"residual": f["residual"][0], "holes": f["holes"][0], "model_extra": f["model_extra"][0], "vocab": VOCAB}
