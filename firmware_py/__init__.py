# kvrtos firmware: runs unchanged on MicroPython (the board) and CPython (the emulator).
VERSION = "0.1.0"
