# Every difference between CPython and MicroPython lives here; nothing else in
# firmware_py/ probes the runtime. Import names from this module, never from
# `micropython`, `time` or `gc` directly, when the two interpreters differ.
import array
import gc
import sys
import time

IS_MICROPYTHON = sys.implementation.name == "micropython"


class AlignmentFault(OSError):
    # what the ESP32-S3 does on a 32-bit (16-bit) load or store at an address that is not a
    # multiple of 4 (2): a LoadStoreAlignment exception. CPython's ptr32 / ptr16 raise it so
    # that a path which would fault on the chip fails on the host too (the unix ports on x86
    # cannot: their viper accesses just work)
    pass


if IS_MICROPYTHON:
    import micropython  # firmware modules import this name from compat

    # Write decorators as @micropython.native / @micropython.viper with `micropython`
    # imported from here: the compiler matches that spelling, not the object.
    const = micropython.const
    heap_lock = micropython.heap_lock
    heap_unlock = micropython.heap_unlock
    HEAP_LOCK = True  # heap_lock() really stops allocation on this interpreter

    ticks_us = time.ticks_us
    ticks_ms = time.ticks_ms
    ticks_add = time.ticks_add
    ticks_diff = time.ticks_diff
    sleep_us = time.sleep_us
    sleep_ms = time.sleep_ms
    # 2**30 on the ESP32 (31-bit small ints), 2**62 on the 64-bit unix port
    TICKS_PERIOD = ticks_add(0, -1) + 1

    def mem_free():
        # bytes free in the MicroPython heap
        return gc.mem_free()

    def mem_alloc():
        # bytes allocated in the MicroPython heap
        return gc.mem_alloc()

    def print_exception(exc, file=None):
        # traceback of exc on stdout (or file); allocates, fault path only
        if file is None:
            sys.print_exception(exc)
        else:
            sys.print_exception(exc, file)

    ptr8 = ptr16 = ptr32 = None  # viper casts are compiler built-ins here

    # micropython.schedule(fn, arg): fn(arg) runs soon on the main thread, between
    # bytecodes (callable from a thread or an interrupt handler; raises RuntimeError when
    # its queue is full)
    schedule = micropython.schedule

    def periodic_timer(period_ms, callback):
        # a started machine.Timer calling callback(timer) every period_ms (a soft
        # callback: it runs between bytecodes of whatever task is running), or None where
        # the port has no machine.Timer (the unix port)
        try:
            from machine import Timer  # noqa: PLC0415 - probing the port
        except ImportError:
            return None
        tm = Timer(0)
        tm.init(period=period_ms, mode=Timer.PERIODIC, callback=callback)
        return tm

    def new_array(typecode, n):
        # array of n elements in one allocation, no temporary buffer (a range has a
        # length, so the array is sized once); contents unspecified until written
        return array.array(typecode, range(n))

    def numpy():
        # numpy module, or None: never on the board
        return None

    def buffer_address(buf):
        # address of buf's first byte (a memoryview window: where the window starts)
        import uctypes  # noqa: PLC0415 - boot-time check only

        return uctypes.addressof(buf)

    @micropython.viper
    def misaligned(buf, mask: int) -> int:
        # the low bits (address & mask) of buf's first byte: 0 when a ptr32 (mask 3) or a
        # ptr16 (mask 1) access to it is aligned. A memoryview window starts where its
        # offset puts it. O(1), no allocation (viper's cast of the buffer's pointer)
        return int(ptr8(buf)) & mask

else:
    TICKS_PERIOD = 1 << 30  # as on the ESP32 port (31-bit small ints)
    _TICKS_MAX = TICKS_PERIOD - 1
    _TICKS_HALF = TICKS_PERIOD // 2
    _t0_ns = time.monotonic_ns()  # pyright: ignore[reportAttributeAccessIssue]

    def const(x):
        # micropython.const: a plain value on CPython
        return x

    def heap_lock():
        # CPython cannot lock its heap; heap-lock tests print SKIP here
        return None

    heap_unlock = heap_lock

    class micropython:  # noqa: N801 - stands in for the module of that name
        # @micropython.native / @micropython.viper / const on CPython: no effect
        const = staticmethod(const)
        heap_lock = staticmethod(heap_lock)
        heap_unlock = staticmethod(heap_lock)

        @staticmethod
        def native(f):
            return f

        viper = native
    HEAP_LOCK = False

    def ticks_us():
        # µs since import, wrapped at 2**30 like MicroPython's time.ticks_us()
        return ((time.monotonic_ns() - _t0_ns) // 1000) & _TICKS_MAX  # pyright: ignore[reportAttributeAccessIssue]

    def ticks_ms():
        # ms since import, wrapped at 2**30 like MicroPython's time.ticks_ms()
        return ((time.monotonic_ns() - _t0_ns) // 1000000) & _TICKS_MAX  # pyright: ignore[reportAttributeAccessIssue]

    def ticks_add(t, delta):
        # t + delta on the wrapped tick circle
        return (t + delta) & _TICKS_MAX

    def ticks_diff(a, b):
        # signed a - b on the wrapped tick circle, as MicroPython defines it
        return ((a - b + _TICKS_HALF) & _TICKS_MAX) - _TICKS_HALF

    def sleep_us(us):
        # block the whole interpreter for us microseconds
        if us > 0:
            time.sleep(us / 1e6)

    def sleep_ms(ms):
        # block the whole interpreter for ms milliseconds
        if ms > 0:
            time.sleep(ms / 1e3)

    def mem_free():
        # CPython has no fixed heap: None means "not measurable here"
        return None

    mem_alloc = mem_free

    def print_exception(exc, file=None):
        # traceback of exc on stdout (or file); fault path only
        import traceback

        traceback.print_exception(type(exc), exc, exc.__traceback__, file=file or sys.stdout)

    def new_array(typecode, n):
        # array of n zero elements in one allocation
        return array.array(typecode, bytes(n * array.array(typecode).itemsize))

    _np = []  # [numpy module or None] once numpy() has been asked

    def numpy():
        # numpy module when importable (imported on first use), else None
        if not _np:
            try:
                import numpy as np
            except ImportError:
                np = None
            _np.append(np)
        return _np[0]

    def schedule(fn, arg):
        # micropython.schedule on CPython: calls fn(arg) now, in the calling thread (the
        # GIL keeps the interrupt ring's single writes whole)
        fn(arg)

    def periodic_timer(period_ms, callback):
        # CPython has no machine.Timer
        return None

    def ptr8(buf):
        # viper's ptr8(buf) on CPython: the buffer itself, indexed by byte
        return memoryview(buf).cast("B")

    def ptr16(buf):
        # viper's ptr16(buf) on CPython: the buffer seen as uint16 (a trailing odd byte is
        # not addressable, as on MicroPython where viper ignores the length). A buffer at an
        # odd address raises AlignmentFault, as the chip faults on its first access
        b = memoryview(buf).cast("B")
        c = buf.__class__
        if c is not bytearray and c is not array.array and buffer_address(b) & 1:
            raise AlignmentFault("ptr16 on a buffer at an odd address (a memoryview window at an odd offset)")
        return b[:len(b) & ~1].cast("H")

    def ptr32(buf):
        # viper's ptr32(buf) on CPython: the buffer seen as uint32 (its whole words: a
        # length that is not a multiple of 4 is accepted, as viper accepts it). A buffer
        # whose address is not a multiple of 4 raises AlignmentFault, as the chip faults
        b = memoryview(buf).cast("B")
        c = buf.__class__
        if c is not bytearray and c is not array.array and buffer_address(b) & 3:
            raise AlignmentFault("ptr32 on a buffer whose address is not a multiple of 4 (a memoryview window "
                                 "at an offset that is not)")
        return b[:len(b) & ~3].cast("I")

    import ctypes as _ct

    class _PyBuffer(_ct.Structure):
        # CPython's Py_buffer (Include/pybuffer.h): buf is the address of the first byte
        _fields_ = [("buf", _ct.c_void_p), ("obj", _ct.c_void_p), ("len", _ct.c_ssize_t),
                    ("itemsize", _ct.c_ssize_t), ("readonly", _ct.c_int), ("ndim", _ct.c_int),
                    ("format", _ct.c_char_p), ("shape", _ct.c_void_p), ("strides", _ct.c_void_p),
                    ("suboffsets", _ct.c_void_p), ("internal", _ct.c_void_p)]

    _get_buffer = _ct.pythonapi.PyObject_GetBuffer
    _get_buffer.argtypes = [_ct.py_object, _ct.POINTER(_PyBuffer), _ct.c_int]
    _release_buffer = _ct.pythonapi.PyBuffer_Release
    _release_buffer.argtypes = [_ct.POINTER(_PyBuffer)]
    _PYBUF_RECORDS_RO = 0x1C  # PyBUF_STRIDES | PyBUF_FORMAT: any buffer, read-only or not

    def buffer_address(buf):
        # address of buf's first byte (a memoryview window: where the window starts), for
        # any buffer, read-only or not (PyObject_GetBuffer); TypeError for a non-buffer
        v = _PyBuffer()
        _get_buffer(buf, _ct.byref(v), _PYBUF_RECORDS_RO)  # raises the buffer's TypeError
        try:
            return v.buf or 0
        finally:
            _release_buffer(_ct.byref(v))

    def misaligned(buf, mask):
        # the low bits (address & mask) of buf's first byte, as on MicroPython: 0 when a
        # ptr32 (mask 3) or ptr16 (mask 1) access is aligned. A bytearray or an array is
        # placed by the allocator (aligned on every interpreter); anything else, a
        # memoryview window above all, by its real address. O(1)
        c = buf.__class__
        if c is bytearray or c is array.array:
            return 0
        return buffer_address(buf) & mask


# True when buf is a writable buffer (bytearray, array, a memoryview of one; not bytes);
# boot-time check only (allocates a memoryview)
def buffer_writable(buf):
    try:
        mv = memoryview(buf)
    except TypeError:
        return False
    if len(mv) == 0:
        return not getattr(mv, "readonly", False)
    try:
        mv[0] = mv[0]  # the same value back: refused by a read-only view on both interpreters
    except TypeError:
        return False
    return True


def collect():
    # full garbage collection on either interpreter
    gc.collect()


# gc.threshold(n) (collect after every n bytes allocated; -1: only when the heap is
# exhausted) on MicroPython, returning the previous setting; nothing on CPython (None)
def gc_threshold(n):
    if not IS_MICROPYTHON or n is None:
        return None
    was = gc.threshold()
    gc.threshold(n)
    return was


# The one heap probe (decode's boot-time sizing, tools/probe.py's calibration):
# (free, largest) bytes after a full collection,
# `largest` being the biggest piece of the free heap one allocation really gets (the GC
# heap's fragmentation is free - largest), found by trying bytearray sizes by bisection
# to within `step` B (about log2(free / step) allocations, each zero-filled: ~14 on an
# 8 MB heap); (None, None) on CPython, which has no fixed heap. A try that fits is
# dropped and collected before the next one
def heap_probe(step=256):
    if not IS_MICROPYTHON:
        return None, None
    gc.collect()
    free = gc.mem_free()
    lo, hi = 0, free + 1  # lo: allocated fine; hi: failed (or more than is free)
    while hi - lo > step:
        mid = (lo + hi) // 2
        if _fits(mid):
            lo = mid
        else:
            hi = mid
    gc.collect()
    return free, lo


def _fits(n):
    # True when a bytearray of n bytes can be had now (it is dropped and collected again)
    try:
        b = bytearray(n)
    except MemoryError:
        return False
    b = None  # noqa: F841 - dropped before the collection
    gc.collect()
    return True


# (total, free, largest free block) of ESP-IDF's data heap outside MicroPython's GC heap
# (esp32.idf_heap_info(esp32.HEAP_DATA) summed, largest of the regions), or None where
# there is no ESP-IDF (the unix port, CPython); reported beside the GC heap's figures
def idf_heap():
    try:
        import esp32  # noqa: PLC0415 - only on the esp32 port
    except ImportError:
        return None
    try:
        regions = esp32.idf_heap_info(esp32.HEAP_DATA)
    except (AttributeError, OSError):
        return None
    total = free = largest = 0
    for r in regions:
        total += r[0]
        free += r[1]
        if r[2] > largest:
            largest = r[2]
    return total, free, largest


# The CPU clock: (Hz the port reports now, what setting want_mhz did) with machine.freq
# where the port has it. want_mhz (0: only read) is the board profile's cpu.mhz, which
# the cost model's cycle figures are counted at: ESP32_GENERIC_S3 boots at 160 MHz unless
# told otherwise, so the firmware sets the profile's clock at boot. The outcome is
# "set" (changed to want_mhz), "kept" (already there), "refused" (the port said no: the
# clock stays), "n/a" (no machine.freq: the unix port, CPython; Hz is None)
def cpu_clock(want_mhz=0):
    try:
        import machine  # noqa: PLC0415 - probing the port

        freq = machine.freq
    except (ImportError, AttributeError):
        return None, "n/a"
    try:
        hz = freq()
    except Exception:  # noqa: BLE001 - a port's freq() may raise anything (NotImplementedError): no clock
        return None, "n/a"
    if isinstance(hz, tuple):  # some ports give (cpu, bus, ...)
        hz = hz[0]
    if not want_mhz or hz == want_mhz * 1000000:
        return hz, "kept"
    try:
        freq(want_mhz * 1000000)
        hz = freq()
        hz = hz[0] if isinstance(hz, tuple) else hz
    except Exception:  # noqa: BLE001 - ValueError (esp32, rp2), NotImplementedError (ports that cannot set it)
        return hz, "refused"
    return hz, ("set" if hz == want_mhz * 1000000 else "refused")
