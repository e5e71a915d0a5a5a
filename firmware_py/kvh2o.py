# H2O's victim search for the KV cache (kv.py): which slot a heavy-hitter sequence
# reuses at its budget. Kept apart from kv.py because it is its own idea and not on the
# common token's path: kv.py's viper append sends every h2o token to its Python path,
# which calls h2o_victim once per evicting token. O(budget), no allocation.
#
# Rule (docs/memory.md): reuse the slot of position n - M if it is still cached (the
# position map's entry, M = 2 x max slots), else the lowest accumulated score among the
# positions p with sinks <= p < n - recent, ties to the oldest p (heavy hitters stay).
from firmware_py.compat import micropython, ptr16, ptr32

_F_SINKS = 5  # kv.py's meta fields read here (sequence row: _CFG + i * _NF)
_F_RECENT = 6
_F_CAP = 2
_CFG = 10
_NF = 13


@micropython.viper
def _lowest_score(arena, table, tbase: int, t: int, bw: int, cap: int, lo: int, hi: int) -> int:
    # the slot (of the cap slots whose blocks are table[tbase ...], T = t per block of
    # bw words) holding a position p with lo <= p < hi and the lowest score, ties to the
    # oldest p; -1 when none. O(cap), no allocation
    p = ptr32(arena)
    tb = ptr16(table)
    best = -1
    best_sc = 0x20000000  # above any saturated score
    best_p1 = 0x3FFFFFFF  # above any position + 1
    slot = 0
    k = 0
    while slot < cap:
        w = int(tb[tbase + k]) * bw  # ring blocks are all allocated (at open)
        r = 0
        while r < t and slot < cap:
            pos1 = int(p[w + 2 * r])  # position + 1; 0 = empty slot
            if pos1 > lo and pos1 <= hi:
                sc = int(p[w + 2 * r + 1])
                if sc < best_sc or (sc == best_sc and pos1 < best_p1):
                    best_sc = sc
                    best_p1 = pos1
                    best = slot
            r += 1
            slot += 1
        k += 1
    return best


# h2o: the slot to reuse at position n of sequence slot index i of cache c (see above);
# O(budget), no allocation
def h2o_victim(c, i, n):
    m = c.map_size
    s = c.pos_map[i * m + n % m]
    if s >= 0:
        return s
    o = _CFG + i * _NF
    meta = c.meta
    best = _lowest_score(c.arena, c.table, i * c.max_blocks, c.t, c.block_words, meta[o + _F_CAP], meta[o + _F_SINKS],
                         n - meta[o + _F_RECENT])
    assert best >= 0, "h2o: no evictable slot"
    return best
