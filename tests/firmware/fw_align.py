# A host as strict as the chip: a viper word load or store at an address that is not a
# multiple of 4 (ptr32) or 2 (ptr16) is a LoadStoreAlignment fault on the ESP32-S3 and
# silently fine on x86. Wherever a caller's buffer reaches a word kernel, its address (not
# only the offset into it) is checked first: a memoryview window at an odd offset is refused
# with E_ALIGN (hot paths) or one line (configuration), before any access and with nothing
# changed, the same on every interpreter; on CPython ptr32 / ptr16 themselves fault.
from array import array

from fwtest import check, eq, raises, no_alloc, done
from firmware_py import compat, dma, kv, pool
from firmware_py.clock import VirtualClock
from firmware_py.sched import Kernel
from firmware_py.status import E_ALIGN, E_STATE, OK

# --- compat.misaligned: the low bits of the address where the buffer (window) starts ---
big = bytearray(64)
for o in range(8):
    eq(compat.misaligned(memoryview(big)[o:], 3), o & 3, "misaligned(window at byte %d, 3)" % o)
    eq(compat.misaligned(memoryview(big)[o:], 1), o & 1, "misaligned(window at byte %d, 1)" % o)
eq(compat.misaligned(big, 3), 0, "a bytearray is placed on a word boundary")
ia = array("i", [0] * 4)
eq((compat.misaligned(ia, 3), compat.misaligned(memoryview(ia)[1:], 3)), (0, 0),
   "an int array, and a window of it (whole 4-byte items)")
eq(compat.misaligned(memoryview(array("h", [0] * 4))[1:], 3), 2, "a window of a short array moves by 2 B")

# --- the KV cache: append, write, read, read_slot ---
lay = kv.Layout(2, 1, 4, "fp32", tokens_per_block=2)
LR = lay.layer_row
P = pool.Pool(lay.block_bytes, 8)
r = P.add_region(8)
c = kv.KVCache(P, lay, max_seqs=2)
h = c.open(r)
raw = bytearray(lay.row_bytes + 8)
for j in range(len(raw)):
    raw[j] = (j * 7 + 1) & 0xFF
for o in (1, 2, 3):
    eq(c.append(h, memoryview(raw)[o:]), E_ALIGN, "append from a window %d B past a word boundary" % o)
    eq((c.length(h), c.status), (0, E_ALIGN), "... appends nothing, and says so in status")
check(c.append(h, memoryview(raw)[4:]) >= 0, "append from a window on a word boundary")
eq(c.length(h), 1, "... appends")
for o in (1, 2, 3):
    eq(c.write(h, 1, memoryview(raw)[o:], 0), E_ALIGN, "write from a window %d B past a word boundary" % o)
dst = bytearray(LR + 8)
for o in (1, 2, 3):
    eq(c.read(h, 0, 0, memoryview(dst)[o:], 0), E_ALIGN, "read into a window %d B past a word boundary" % o)
    eq(c.read_slot(h, 0, 1, memoryview(dst)[o:], 0), E_ALIGN, "read_slot into a window %d B past" % o)
check(all(dst[j] == 0 for j in range(len(dst))), "... nothing written to dst")
eq(c.read(h, 0, 1, memoryview(dst)[4:], 0), OK, "read into a window on a word boundary")
eq(bytes(dst[4:4 + LR]), bytes(raw[4 + LR:4 + 2 * LR]), "... gives layer 1 as appended (the refused write changed nothing)")
eq(c.write(h, 1, memoryview(raw)[8:], 0), OK, "write from a window 8 B in")
eq(c.read(h, 0, 1, dst, 0), OK, "read it back")
eq(bytes(dst[:LR]), bytes(raw[8:8 + LR]), "... as written")
eq(c.append(h, memoryview(raw)[2:]), E_ALIGN, "a refused append ...")
eq(c.write(h, 0, raw, 0), E_STATE, "... ends the earlier reservation (as every refused append)")

# the refusals under heap_lock: no allocation (windows made before the lock)
src_odd = memoryview(raw)[1:]
dst_odd = memoryview(dst)[3:]
got = array("i", [0, 0, 0, 0])


def refusals():
    got[0] = c.append(h, src_odd)
    got[1] = c.write(h, 0, src_odd, 0)
    got[2] = c.read(h, 0, 0, dst_odd, 0)
    got[3] = c.read_slot(h, 0, 0, dst_odd, 0)


no_alloc("E_ALIGN refusals of append, write, read, read_slot", refusals)
eq(list(got), [E_ALIGN] * 4, "... each E_ALIGN")

# int4 (KIVI): append goes through its own put (ptr32 on src): refused the same way
lay4 = kv.Layout(2, 1, 8, "int4", tokens_per_block=2)
P4 = pool.Pool(lay4.block_bytes, 8)
c4 = kv.KVCache(P4, lay4, max_seqs=1)
h4 = c4.open(P4.add_region(8))
raw4 = bytearray(lay4.row_bytes + 4)
eq(c4.append(h4, memoryview(raw4)[2:]), E_ALIGN, "int4 append from a window 2 B past a word boundary")
eq(c4.length(h4), 0, "... appends nothing")
check(c4.append(h4, memoryview(raw4)[4:]) >= 0, "int4 append from a window on a word boundary")

# --- DMA: a registered window must start on a word boundary; copy_bytes never word-copies
# between unaligned addresses ---
k = Kernel(VirtualClock(), max_tasks=4)
q = dma.DMAQueue(k, 4)
e = raises(dma.DMAError, q.add_buffer, memoryview(bytearray(64))[2:], 0)
check("4-byte boundary" in str(e) and "\n" not in str(e), "add_buffer of a window 2 B in: one line")
check(q.add_buffer(memoryview(bytearray(64))[4:], 0) >= 0, "add_buffer of a window 4 B in")
src = bytearray(48)
for j in range(48):
    src[j] = j + 1
for so, do in ((3, 1), (1, 0), (0, 2), (4, 8)):
    d = bytearray(48)
    dma.copy_bytes(memoryview(d)[do:], 4, memoryview(src)[so:], 0, 16)
    eq(bytes(d[do + 4:do + 20]), bytes(src[so:so + 16]), "copy_bytes between windows at %d and %d" % (so, do))

# --- CPython: ptr32 / ptr16 fault like the chip (the unix ports on x86 cannot) ---
if not compat.IS_MICROPYTHON:
    raises(compat.AlignmentFault, compat.ptr32, memoryview(big)[2:])
    raises(compat.AlignmentFault, compat.ptr16, memoryview(big)[1:])
    raises(compat.AlignmentFault, pool.copy32, memoryview(big)[1:], 0, big, 0, 2)
    eq(len(compat.ptr16(memoryview(big)[2:])), 31, "ptr16 of a window 2 B in")
    eq(len(compat.ptr32(memoryview(big)[4:])), 15, "ptr32 of a window 4 B in")

done()
