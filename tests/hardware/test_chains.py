"""benchmarks/chains.py: kernels too short for the profiler, timed end to end in chains."""
import pytest

from nasctl.hardware.layers import LayerSpec
from nasctl.hardware.onnx_import import import_onnx


def _token(op: str, cin: int, cout: int, tokens: int, fn: str = "") -> LayerSpec:
    return LayerSpec(op, cin, cout, (tokens, 1), (tokens, 1), (1, 1), 1, 1, 32, 32, fn=fn)


@pytest.mark.parametrize("layer,back", [
    (_token("linear", 16, 16, 4), None),
    (_token("linear", 16, 64, 16, fn="gelu"), _token("linear", 64, 16, 16, fn="gelu")),  # with its way back
    (_token("norm", 32, 32, 16, fn="layer"), None),
    (_token("add", 48, 48, 4), None),
])
def test_a_chain_holds_the_kernel_as_often_as_asked_and_the_importer_reads_it_so(tmp_path, bench_module, layer, back):
    chains = bench_module("chains")
    assert chains.chainable(layer)
    linked = {layer.shape_key()} | ({back.shape_key()} if back else set())
    count, ends = {}, {}
    for k in (2, 5):
        path = tmp_path / f"chain{k}.onnx"
        path.write_bytes(chains.chain_network(layer, k))
        keys = [l.shape_key() for l in import_onnx(path).layers]
        count[k] = {key: keys.count(key) for key in linked}
        ends[k] = [key for key in keys if key not in linked]
    # three more links, three more of each linked kernel and nothing else: the slope over
    # chain lengths is the kernel's (with its way back, the pair's)
    assert all(count[5][key] - count[2][key] == 3 for key in linked)
    assert ends[5] == ends[2]


def test_only_token_kernels_of_small_inputs_are_chained(bench_module):
    chains = bench_module("chains")
    assert not chains.chainable(_token("linear", 16, 16, 5))  # not 4 or 16 tokens
    assert not chains.chainable(LayerSpec("conv", 16, 16, (4, 4), (4, 4), (3, 3), 1, 1, 32, 32))
    assert not chains.chainable(LayerSpec("linear", 16, 16, (4, 1), (4, 1), (1, 1), 1, 1, 8, 8))  # int8
