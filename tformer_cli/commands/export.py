"""`tformer export checkpoint=PATH [format=onnx] [quantize=int8] [out=DIR] [opset=N]`."""
from __future__ import annotations

from ..errors import TformerError
from .options import parse_key_values

USAGE = """usage: tformer export [checkpoint=PATH] [format=onnx] [quantize=none|int8] [out=DIR] [opset=17]

Writes the checkpoint (default: the newest run's best) as an ONNX model with its tokenizer and labels, checked
against PyTorch (max logit difference printed; fp32 exports over 1e-4 are refused). Default out:
<run dir>/export/onnx (onnx-int8 when quantized). Then: tformer predict --runtime onnx --checkpoint <run dir>."""

DEFAULTS = {"checkpoint": None, "format": "onnx", "quantize": None, "out": None, "opset": "17",
            "outputs_dir": "outputs"}


def parse_args(argv: list[str]) -> dict:
    opts = parse_key_values(argv, DEFAULTS, USAGE, "export")
    if opts["format"] != "onnx":
        raise TformerError(f"format={opts['format']!r} is not supported; the one export format is onnx")
    try:
        opts["opset"] = int(opts["opset"])
    except ValueError:
        raise TformerError(f"opset={opts['opset']!r} must be an integer (17 is the default)") from None
    if not 14 <= opts["opset"] <= 21:
        raise TformerError(f"opset={opts['opset']} must be between 14 and 21")
    return opts


def main(argv: list[str]) -> int:
    opts = parse_args(argv)
    from ..console import output
    from ..deploy.export import PARITY_TOLERANCE, export_onnx, quantization
    from ..safe_text import markup
    from ..store.locate import newest

    opts["quantize"] = quantization(opts["quantize"])  # (checked before the line saying what is exported)
    source = opts["checkpoint"] or newest(opts["outputs_dir"]).path
    console = output()
    console.print(f"exporting [bold]{markup(source)}[/] to ONNX (opset {opts['opset']}"
                  f"{', int8 dynamic quantization' if opts['quantize'] else ''})", highlight=False)
    done = export_onnx(source, opts["out"], quantize=opts["quantize"], opset=opts["opset"])
    check = (f"max |logit difference| vs PyTorch {done.max_abs_logit_diff:.2e}"
             + (f" (limit {PARITY_TOLERANCE:.0e})" if not opts["quantize"] else "")
             + f", same {done.answer} on {done.label_agreement:.1%} of the parity sequences")
    console.print(f"wrote {markup(done.path)} ({done.bytes / 1e6:.1f} MB, {done.seconds:.1f} s); {check}",
                  highlight=False)
    console.print(f"predict with it: tformer predict --runtime onnx --checkpoint {markup(done.path)} \"some text\"",
                  highlight=False)
    return 0
