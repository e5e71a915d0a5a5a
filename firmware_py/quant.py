# Packing K/V vectors into the cache's row format (firmware_py/kv.py Layout): fp32
# bit patterns, int8 with one scale per token per KV head, int4tok (two per byte, low
# nibble first) with one scale per `group` channels. Symmetric: scale = max|x| / qmax,
# q = round(x / scale), so |x - q * scale| <= scale / 2 for every element.
# int4 (KIVI): the caller's row holds K in fp32 (the cache quantizes keys per channel
# over a block itself: firmware_py/kvkivi.py) and V as int4tok does.
# This is the model-side math: it uses floats, so it allocates on MicroPython (boxed
# floats); the cache itself only ever copies the packed rows.
import struct

from firmware_py.compat import const

_QMAX8 = const(127)
_QMAX4 = const(7)


# pack one layer's K and V (sequences of kv_dim floats) into dst at byte off, in
# layout's layer_row format; O(kv_dim), allocates (floats)
def pack_layer(layout, k, v, dst, off):
    if layout.kivi:
        struct.pack_into("<%df" % layout.kv_dim, dst, off, *k)
    else:
        _pack(layout, k, dst, off, off + layout.ks_off)
    _pack(layout, v, dst, off + layout.v_off, off + layout.vs_off)


# pack a whole token row (ks[l], vs[l] for every layer) into dst (row_bytes); allocates
def pack_token(layout, ks, vs, dst):
    for layer in range(layout.n_layers):
        pack_layer(layout, ks[layer], vs[layer], dst, layer * layout.layer_row)


# the K (which=0) or V (which=1) floats of one layer row at byte off of src; allocates
def unpack_layer(layout, src, off, which):
    d = off + (layout.v_off if which else 0)
    s = off + (layout.vs_off if which else layout.ks_off)
    n = layout.kv_dim
    dt = layout.dtype
    if dt == "fp32" or (layout.kivi and not which):
        return list(struct.unpack_from("<%df" % n, src, d))
    if dt == "fp16":
        return list(struct.unpack_from("<%de" % n, src, d))
    out = []
    g = layout.group
    for i in range(n):
        sc = struct.unpack_from("<f", src, s + 4 * (i // g))[0]
        if dt == "int8":
            q = src[d + i]
            q = q - 256 if q > 127 else q
        else:
            q = (src[d + i // 2] >> (4 * (i & 1))) & 15
            q = q - 16 if q > 7 else q
        out.append(q * sc)
    return out


# the largest error dequantization may show for x under layout (0 for fp32; int4: for
# V, its keys' bound depends on the block: kivi_bound); allocates
def error_bound(layout, x):
    dt = layout.dtype
    if dt == "fp32":
        return 0.0
    if dt == "fp16":
        return max(abs(e) for e in x) / 1024.0 + 1e-7
    g = layout.group
    qmax = _QMAX8 if dt == "int8" else _QMAX4
    worst = 0.0
    for j in range(0, len(x), g):
        amax = max(abs(e) for e in x[j:j + g])
        worst = max(worst, amax / qmax / 2)
    return worst * 1.0001 + 1e-12


def _pack(layout, x, dst, d, s):
    n = layout.kv_dim
    dt = layout.dtype
    if dt == "fp32" or dt == "fp16":
        pack_range(layout, x, dst, d, 0.0, 0, n)
        return
    g = layout.group
    for j in range(0, n, g):
        sc = put_scale(layout, dst, s, j, group_max(x, j, j + g, 0.0))
        pack_range(layout, x, dst, d, sc, j, j + g)


# the parts of _pack (a sliced decode step packs a row in units: kernels.Plain.store_part;
# the same bytes as pack_layer): the largest |x| of elements i0 .. i1 - 1, or amax if larger
def group_max(x, i0, i1, amax):
    for i in range(i0, i1):
        a = abs(x[i])
        if a > amax:
            amax = a
    return amax


# ... the scale of the group that holds element j stored for its max |x| amax at byte s
# of dst (the row's scales); returns the stored (fp32) scale
def put_scale(layout, dst, s, j, amax):
    o = s + 4 * (j // layout.group)
    struct.pack_into("<f", dst, o, amax / (_QMAX8 if layout.dtype == "int8" else _QMAX4))
    return struct.unpack_from("<f", dst, o)[0]


# ... elements i0 .. i1 - 1 of x packed at byte d of dst (the row's data): fp32/fp16 as
# they are, int8/int4 quantized at scale sc (i0 .. i1 within one group)
def pack_range(layout, x, dst, d, sc, i0, i1):
    dt = layout.dtype
    if dt == "fp32" or dt == "fp16":
        b = 4 if dt == "fp32" else 2
        struct.pack_into("<%d%s" % (i1 - i0, "f" if b == 4 else "e"), dst, d + b * i0, *x[i0:i1])
        return
    qmax = _QMAX8 if dt == "int8" else _QMAX4
    for i in range(i0, i1):
        q = int(round(x[i] / sc)) if sc > 0 else 0
        if q > qmax:
            q = qmax
        elif q < -qmax:
            q = -qmax
        if dt == "int8":
            dst[d + i] = q & 255
        elif i & 1:
            dst[d + i // 2] = (dst[d + i // 2] & 15) | ((q & 15) << 4)
        else:
            dst[d + i // 2] = (dst[d + i // 2] & 0xF0) | (q & 15)


# int4 (KIVI): the largest error of a key of a block whose channel holds the values xs
# (every live slot's key in that channel when it was folded, once): half a step of
# (max - min) / 15, plus the fixed point's rounding (docs/memory.md); allocates
def kivi_bound(xs):
    m = max(abs(e) for e in xs)
    if m == 0:
        return 0.0
    unit = 2.0 ** (_top(m) - 11)  # one unit of the channel's fixed point
    rng = max(xs) - min(xs)
    return (rng / 15.0 / 2.0 + 1.5 * unit) * 1.0001 + 1e-30


# the least t with m < 2**t (m > 0); allocates
def _top(m):
    t = 0
    while m >= 2.0 ** t:
        t += 1
    while m < 2.0 ** (t - 1):
        t -= 1
    return t
