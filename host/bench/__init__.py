# Benchmarks: one module per subject (host/bench/<name>.py) with
# run(as_json: bool) -> dict that measures in one run and prints its figures.
