# kvrtos host tools (CPython only): flashing, the virtual board, monitor, budget, emulator.
