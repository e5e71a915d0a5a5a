# Copied to the board as /main.py by `kv flash`: MicroPython runs it after boot.py.
from firmware_py import app

app.main()
