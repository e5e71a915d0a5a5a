# Board-side tools: probes and benchmarks that run on the target interpreter but are not
# the firmware. `kv flash` leaves this folder out; host/bench and the budget check run
# these scripts under MicroPython (or CPython) straight from the repository.
