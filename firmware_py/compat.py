# Every difference between CPython and MicroPython lives here; nothing else in
# firmware_py/ probes the runtime. Import names from this module, never from
# `micropython`, `time` or `gc` directly, when the two interpreters differ.
import array
import gc
import sys
import time

IS_MICROPYTHON = sys.implementation.name == "micropython"

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
        # not addressable, as on MicroPython where viper ignores the length)
        b = memoryview(buf).cast("B")
        return b[:len(b) & ~1].cast("H")

    def ptr32(buf):
        # viper's ptr32(buf) on CPython: the buffer seen as uint32 (its whole words: a
        # length that is not a multiple of 4 is accepted, as viper accepts it)
        b = memoryview(buf).cast("B")
        return b[:len(b) & ~3].cast("I")

    def buffer_address(buf):
        # address of buf's first byte (a memoryview window: where the window starts);
        # buf must be writable (boot-time check only)
        import ctypes  # noqa: PLC0415 - boot-time check only

        mv = memoryview(buf).cast("B")
        return ctypes.addressof((ctypes.c_char * len(mv)).from_buffer(mv))


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
