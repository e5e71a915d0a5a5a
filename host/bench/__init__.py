# Benchmarks: one module per subject (host/bench/<name>.py) with
# run(as_json: bool) -> dict that measures in one run and prints its figures.


import json


# what every bench module's run() ends with: r as one JSON object (--json) or as the
# lines render(r) makes; returns r
def emit(r, as_json, render):
    if as_json:
        print(json.dumps(r, sort_keys=True))
    else:
        for line in render(r):
            print(line)
    return r
