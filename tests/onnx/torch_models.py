#!/usr/bin/python3
"""Exports real architectures with Debian's python3-torch (and torchvision
where packaged) to ONNX at the given opsets, with torch's own outputs as
test data, then runs `kcache run MODEL --data DIR` on each and prints one
line per model: ok, or kcache's error (every unsupported node it names).

A developer's tool, not a CI suite: torch is a benchmark dependency only.
Random weights; inputs seeded. Usage:
  tests/onnx/torch_models.py --kcache build/client/kcache --out DIR
      [--opsets 13,17] [--only NAME,...] [--list]
"""
import argparse
import os
import subprocess
import sys
import time

import torch


def tv(name, size=224, **kw):
    def make():
        import torchvision
        return getattr(torchvision.models, name)(weights=None, **kw), (1, 3, size, size)
    return make


class Seq(torch.nn.Module):
    """An RNN layer with its final states as outputs."""

    def __init__(self, kind, **kw):
        super().__init__()
        self.rnn = getattr(torch.nn, kind)(**kw)

    def forward(self, x):
        y = self.rnn(x)
        return y[0], y[1]


def rnn(kind, **kw):
    def make():
        kw.setdefault("input_size", 16)
        kw.setdefault("hidden_size", 24)
        t = (5, 2, 16) if not kw.get("batch_first") else (2, 5, 16)
        return Seq(kind, **kw), t
    return make


def encoder():
    layer = torch.nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128,
                                             batch_first=True)
    return torch.nn.TransformerEncoder(layer, num_layers=2), (2, 10, 64)


class Dec(torch.nn.Module):
    def __init__(self):
        super().__init__()
        layer = torch.nn.TransformerDecoderLayer(d_model=64, nhead=4, dim_feedforward=128,
                                                 batch_first=True)
        self.dec = torch.nn.TransformerDecoder(layer, num_layers=2)
        self.register_buffer("mask", torch.nn.Transformer.generate_square_subsequent_mask(10))

    def forward(self, x):
        return self.dec(x, x[:, :6], tgt_mask=self.mask)


def decoder():
    return Dec(), (2, 10, 64)


class Full(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.t = torch.nn.Transformer(d_model=64, nhead=4, num_encoder_layers=1,
                                      num_decoder_layers=1, dim_feedforward=128,
                                      batch_first=True)

    def forward(self, x):
        return self.t(x, x[:, :7])


def transformer():
    return Full(), (2, 10, 64)


class Up(torch.nn.Module):
    def __init__(self, mode, **kw):
        super().__init__()
        self.mode, self.kw = mode, kw

    def forward(self, x):
        return torch.nn.functional.interpolate(x, mode=self.mode, **self.kw)


def interp(mode, **kw):
    return lambda: (Up(mode, **kw), (1, 3, 9, 11))


MODELS = {
    "alexnet": tv("alexnet", 224), "convnext_tiny": tv("convnext_tiny", 64),
    "densenet121": tv("densenet121", 64), "efficientnet_b0": tv("efficientnet_b0", 64),
    "efficientnet_v2_s": tv("efficientnet_v2_s", 64), "googlenet": tv("googlenet", 64,
                                                                         aux_logits=False,
                                                                         init_weights=True),
    "inception_v3": tv("inception_v3", 96, aux_logits=False, init_weights=True),
    "mnasnet0_5": tv("mnasnet0_5", 64), "mobilenet_v2": tv("mobilenet_v2", 64),
    "mobilenet_v3_small": tv("mobilenet_v3_small", 64), "regnet_x_400mf": tv("regnet_x_400mf", 64),
    "regnet_y_400mf": tv("regnet_y_400mf", 64), "resnet18": tv("resnet18", 64),
    "resnext50_32x4d": tv("resnext50_32x4d", 64), "shufflenet_v2_x0_5": tv("shufflenet_v2_x0_5", 64),
    "squeezenet1_0": tv("squeezenet1_0", 64), "vgg11": tv("vgg11", 224),
    "swin_t": tv("swin_t", 64), "vit_b_16": tv("vit_b_16", 224),
    "wide_resnet50_2": tv("wide_resnet50_2", 64),
    "transformer_encoder": encoder, "transformer_decoder": decoder, "transformer": transformer,
    "lstm": rnn("LSTM"), "lstm_2layer_bidi": rnn("LSTM", num_layers=2, bidirectional=True),
    "lstm_batch_first": rnn("LSTM", batch_first=True), "gru": rnn("GRU"),
    "gru_bidi": rnn("GRU", bidirectional=True, num_layers=2), "rnn_tanh": rnn("RNN"),
    "rnn_relu_bidi": rnn("RNN", nonlinearity="relu", bidirectional=True),
    "resize_nearest": interp("nearest", scale_factor=2),
    "resize_bilinear": interp("bilinear", size=(14, 5), align_corners=False),
    "resize_bilinear_ac": interp("bilinear", scale_factor=1.5, align_corners=True),
    "resize_bicubic": interp("bicubic", scale_factor=2, align_corners=False),
}


def write_pb(path, t, name):
    from onnx import numpy_helper
    with open(path, "wb") as f:
        f.write(numpy_helper.from_array(t.detach().numpy(), name).SerializeToString())


def flat(y):
    if isinstance(y, (tuple, list)):
        return [t for e in y for t in flat(e)]
    return [y]


def calibrate(model, shape):
    """Sets batch-norm statistics from two random batches: with untrained
    statistics (mean 0, variance 1) deep networks such as inception_v3 reach
    activations of 1e5, where float32 summation order alone moves the logits
    by more than the tolerance."""
    bns = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not bns:
        return
    for m in bns:
        m.momentum = None  # a plain average of the batches seen
    model.train()
    with torch.no_grad():
        for _ in range(2):
            model(torch.randn(2, *shape[1:]))


def export(name, opset, out):
    torch.manual_seed(0)
    model, shape = MODELS[name]()
    calibrate(model, shape)
    model.eval()
    x = torch.randn(*shape)
    d = os.path.join(out, "%s_op%d" % (name, opset))
    os.makedirs(os.path.join(d, "test_data_set_0"), exist_ok=True)
    path = os.path.join(d, "model.onnx")
    with torch.no_grad():
        ys = flat(model(x))
    # with gradients enabled, so torch takes its exportable paths rather than
    # the fused inference kernels (_transformer_encoder_layer_fwd)
    torch.onnx.export(model, (x,), path, opset_version=opset, input_names=["x"],
                      output_names=["y%d" % i for i in range(len(ys))])
    write_pb(os.path.join(d, "test_data_set_0", "input_0.pb"), x, "x")
    for i, t in enumerate(ys):
        write_pb(os.path.join(d, "test_data_set_0", "output_%d.pb" % i), t, "y%d" % i)
    return d


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kcache", default="build/client/kcache")
    ap.add_argument("--out", required=True)
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--opsets", default="13,17")
    ap.add_argument("--only", default="")
    ap.add_argument("--list", action="store_true", help="print the ONNX op types only")
    args = ap.parse_args()
    names = [n for n in args.only.split(",") if n] or list(MODELS)
    cache = args.cache_dir or os.path.join(args.out, "cache")
    bad = 0
    for name in names:
        for opset in [int(o) for o in args.opsets.split(",")]:
            t0 = time.time()
            try:
                d = export(name, opset, args.out)
            except Exception as e:  # the exporter itself refuses
                print("%-24s opset %d: torch cannot export: %s" % (name, opset,
                                                                   str(e).splitlines()[0]))
                continue
            if args.list:
                import onnx
                m = onnx.load(os.path.join(d, "model.onnx"))
                print("%-24s opset %d: %s" % (name, opset,
                                              " ".join(sorted({n.op_type for n in m.graph.node}))))
                continue
            p = subprocess.run([args.kcache, "--cache-dir", cache, "-q", "run",
                                os.path.join(d, "model.onnx"), "--data",
                                os.path.join(d, "test_data_set_0")],
                               capture_output=True, text=True, errors="replace")
            msg = "ok" if p.returncode == 0 else (p.stderr or p.stdout).strip()
            bad += p.returncode != 0
            print("%-24s opset %d (%.0f s): %s" % (name, opset, time.time() - t0, msg),
                  flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
