#!/usr/bin/python3
"""bench/models_torch.py - the torch side of bench/models.sh (Debian's python3-torch
1.13 and python3-torchvision; run with /usr/bin/python3):

  export OUTDIR        writes OUTDIR/{resnet18,mobilenet_v2,encoder,decoder}.onnx with
                       torch's own ONNX exporter (opset 14, random weights, eval mode),
                       and beside each OUTDIR/NAME.data/{input_0,output_0}.pb: a random
                       input and torch's output for it (`kcache run --data`)
  time OUTDIR THREADS ITERS MODEL...
                       times torch eager on each MODEL (no_grad, THREADS intra-op
                       threads): one warm-up call, then ITERS calls; prints one JSON
                       line per model with the median and minimum per-call
                       milliseconds and the BLAS and oneDNN libraries the process mapped

The models:
  resnet18, mobilenet_v2   torchvision's, 1x3x224x224
  encoder                  nn.TransformerEncoder: 4 layers, d=256, 4 heads, FFN 1024,
                           seq 64, batch 1 (input [1,64,256])
  decoder                  a GPT-style decoder: token + position embeddings, 4 pre-LN
                           blocks (causal self-attention with 4 heads, GELU MLP 4d),
                           final LayerNorm and an LM head over a 2048-token vocabulary;
                           d=256, seq 64 (input: int64 token ids [1,64])
"""
import json
import math
import os
import statistics
import sys
import time

import torch
from onnx import numpy_helper
from torch import nn

D, HEADS, SEQ, LAYERS, VOCAB = 256, 4, 64, 4, 2048


class Block(nn.Module):
    """One pre-LN GPT block with an explicit causal mask (what GPT-2 exports)."""

    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(D)
        self.qkv = nn.Linear(D, 3 * D)
        self.proj = nn.Linear(D, D)
        self.ln2 = nn.LayerNorm(D)
        self.fc = nn.Linear(D, 4 * D)
        self.out = nn.Linear(4 * D, D)
        self.register_buffer("mask", torch.tril(torch.ones(SEQ, SEQ, dtype=torch.bool)).view(1, 1, SEQ, SEQ))

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(D, dim=2)
        q = q.view(b, t, HEADS, D // HEADS).transpose(1, 2)
        k = k.view(b, t, HEADS, D // HEADS).transpose(1, 2)
        v = v.view(b, t, HEADS, D // HEADS).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D // HEADS))
        att = att.masked_fill(~self.mask[:, :, :t, :t], float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, D)
        x = x + self.proj(y)
        return x + self.out(nn.functional.gelu(self.fc(self.ln2(x))))


class Decoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, D)
        self.pos = nn.Embedding(SEQ, D)
        self.blocks = nn.ModuleList([Block() for _ in range(LAYERS)])
        self.ln = nn.LayerNorm(D)
        self.head = nn.Linear(D, VOCAB, bias=False)
        self.register_buffer("positions", torch.arange(SEQ).view(1, SEQ))

    def forward(self, ids):
        x = self.tok(ids) + self.pos(self.positions)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


def calibrated(m, shape):
    """m with BatchNorm statistics taken from random inputs, so that activations keep
    their scale through the net (with the initial mean 0 / variance 1 a random-weight
    mobilenet_v2 ends in outputs near 1e-12, where any answer is within tolerance)."""
    for mod in m.modules():
        if isinstance(mod, nn.modules.batchnorm._BatchNorm):
            mod.reset_running_stats()
            mod.momentum = None  # a plain average over the calibration batches
    m.train()
    with torch.no_grad():
        for _ in range(4):
            m(torch.randn(2, *shape[1:]))
    return m.eval()


def models():
    import torchvision

    torch.manual_seed(0)
    image = (1, 3, 224, 224)
    enc = nn.TransformerEncoder(
        nn.TransformerEncoderLayer(D, HEADS, dim_feedforward=4 * D, dropout=0.0, batch_first=True),
        num_layers=LAYERS, enable_nested_tensor=False)
    for layer in enc.layers:  # TransformerEncoder deep-copies one layer: give each its own weights
        for mod in layer.modules():
            if isinstance(mod, (nn.Linear, nn.MultiheadAttention)):
                mod._reset_parameters() if isinstance(mod, nn.MultiheadAttention) else mod.reset_parameters()
    return {
        "resnet18": (calibrated(torchvision.models.resnet18(weights=None), image), torch.randn(image)),
        "mobilenet_v2": (calibrated(torchvision.models.mobilenet_v2(weights=None), image), torch.randn(image)),
        "encoder": (enc, torch.randn(1, SEQ, D)),
        "decoder": (Decoder(), torch.randint(0, VOCAB, (1, SEQ))),
    }


def export(outdir):
    os.makedirs(outdir, exist_ok=True)
    for name, (m, x) in models().items():
        m.eval()
        path = os.path.join(outdir, name + ".onnx")
        # with gradients enabled: under no_grad nn.TransformerEncoderLayer takes its
        # fused fast path (aten::_transformer_encoder_layer_fwd), which has no ONNX form
        torch.onnx.export(m, (x,), path, opset_version=14, input_names=["input"],
                          output_names=["output"], do_constant_folding=True)
        data = os.path.join(outdir, name + ".data")
        os.makedirs(data, exist_ok=True)
        with torch.no_grad():
            y = m(x)
        for fname, t in (("input_0.pb", x), ("output_0.pb", y)):
            with open(os.path.join(data, fname), "wb") as f:
                f.write(numpy_helper.from_array(t.numpy()).SerializeToString())
        print("%s: %.1f MB" % (path, os.path.getsize(path) / 1e6), file=sys.stderr)


def mapped(*names):
    """The first mapped library whose file name contains one of names."""
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1]
            if any(n in os.path.basename(path) for n in names):
                return os.path.realpath(path)
    return "-"


def time_model(all_models, name, threads, iters):
    torch.set_num_threads(threads)
    m, x = all_models[name]
    m.eval()
    times = []
    with torch.no_grad():
        m(x)  # warm-up: first-call allocations, oneDNN primitive creation
        for _ in range(iters):
            t0 = time.perf_counter()
            m(x)
            times.append((time.perf_counter() - t0) * 1e3)
    print(json.dumps({"model": name, "threads": torch.get_num_threads(), "iters": iters,
                      "median_ms": statistics.median(times), "min_ms": min(times),
                      "blas": mapped("libblas", "openblas"), "onednn": mapped("libdnnl")}))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "export":
        export(sys.argv[2])
    elif len(sys.argv) >= 6 and sys.argv[1] == "time":
        built = models()
        for name in sys.argv[5:]:
            time_model(built, name, int(sys.argv[3]), int(sys.argv[4]))
    else:
        sys.exit(__doc__)
