"""What the CLI tests share: running a command, and the shape of a user error."""

from pathlib import Path

from typer.testing import CliRunner

from nasctl.cli import app

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def one_line_error(result, code, text):
    assert result.exit_code == code, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and text in lines[0], result.stderr


# a small ee-mbv2 (tests/data/small-mbv2.yaml) for tests that run whole searches to check what
# a search does, not what ee-mbv2 is: each candidate trains about four times faster
SMALL_SPACE = str(Path(__file__).resolve().parents[1] / "data" / "small-mbv2.yaml")
# and a small ee-vit (tests/data/small-vit.yaml), with a bit width of the attention of its own
SMALL_VIT = str(Path(__file__).resolve().parents[1] / "data" / "small-vit.yaml")


def onnx_model(graph, opset: int = 17, **kw):
    """A model of `graph` at `opset`, with the IR version that opset needs rather than the
    newest the installed onnx writes: an onnxruntime older than that onnx still loads it.
    (An opset the installed onnx does not know keeps its newest IR version.)"""
    import onnx
    from onnx import helper

    opsets = [helper.make_opsetid("", opset)]
    if opset <= onnx.defs.onnx_opset_version():
        return helper.make_model_gen_version(graph, opset_imports=opsets, **kw)
    return helper.make_model(graph, opset_imports=opsets, **kw)
