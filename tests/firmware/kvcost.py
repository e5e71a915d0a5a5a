# ns per append / reserve + 5 write() of a stories260K fp32 token (5 layers, 4 KV heads x 8)
# on a window ring of 512, and the same rows copied into one flat preallocated array per
# layer (llama2.c's layout), median of 5; run: MICROPYPATH=. .venv/bin/micropython -X heapsize=2M tests/firmware/kvcost.py
from firmware_py import kv, pool
from firmware_py.compat import ticks_us, ticks_diff
L = kv.Layout(5, 4, 8, "fp32")
nb = 512 // 16 + 2
p = pool.Pool(L.block_bytes, nb)
c = kv.KVCache(p, L, max_seqs=2)
r = p.add_region(nb)
row = bytearray(L.row_bytes)
N = 2000
def t_append(s):
    t0 = ticks_us()
    for _ in range(N):
        c.append(s, row)
    return ticks_diff(ticks_us(), t0) * 1000 // N
def t_rw(s):
    lr = L.layer_row
    t0 = ticks_us()
    for _ in range(N):
        c.reserve(s)
        c.write(s, 0, row, 0)
        c.write(s, 1, row, lr)
        c.write(s, 2, row, 2 * lr)
        c.write(s, 3, row, 3 * lr)
        c.write(s, 4, row, 4 * lr)
    return ticks_diff(ticks_us(), t0) * 1000 // N
flat = bytearray(L.row_bytes * 512)
def t_flat():
    w = L.layer_row // 4
    t0 = ticks_us()
    for i in range(N):
        slot = i & 511
        for ly in range(5):
            pool.copy32(flat, (ly * 512 + slot) * w, row, ly * w, w)
    return ticks_diff(ticks_us(), t0) * 1000 // N
s = c.open(r, "window", 512)
for _ in range(600):
    c.append(s, row)
a = []
b = []
f = []
for _ in range(5):
    a.append(t_append(s))
    b.append(t_rw(s))
    f.append(t_flat())
a.sort()
b.sort()
f.sort()
print("append_ns", a[2], "reserve+5write_ns", b[2], "flat_ns", f[2])
