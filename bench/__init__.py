"""The experiment layer: benchmarks and studies behind the committed reports under eval/.

Run from the repository root as modules (`python -m bench.link`, `python -m bench.accuracy`, ...); each reads its
data through one catalogue (`bench.data`: ../shared/data, or $LINKER_SHARED_DATA) and writes its report through one
writer (`bench.report`: markdown + json, optional png, a header naming the command, date, CPUs, load and commit).
The library (`linker/`) never imports this package; systems are built by recipes (`linker recipe run`).
"""
