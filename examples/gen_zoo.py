#!/usr/bin/env python3
"""gen_zoo.py - writes the kcache model zoo (kcache-graph/1 JSON) and the
prewarm manifest. The graphs are synthetic but shaped like the real thing:
an MLP, a transformer block, a small convnet and a GPT-style stack at several
widths. Run from anywhere: python3 examples/gen_zoo.py"""
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))


class G:
    def __init__(self, name):
        self.name, self.inputs, self.params, self.nodes, self.n = name, [], [], [], 0

    def inp(self, name, shape):
        self.inputs.append({"name": name, "dtype": "f32", "shape": shape})
        return name

    def par(self, name, shape):
        self.params.append({"name": name, "dtype": "f32", "shape": shape})
        return name

    def op(self, op, ins, attrs=None, out=None):
        self.n += 1
        out = out or f"t{self.n}"
        node = {"op": op, "in": ins, "out": out}
        if attrs:
            node["attrs"] = attrs
        self.nodes.append(node)
        return out

    def write(self, outputs):
        g = {"format": "kcache-graph/1", "name": self.name, "inputs": self.inputs,
             "params": self.params, "nodes": self.nodes, "outputs": outputs}
        with open(os.path.join(HERE, self.name + ".json"), "w") as f:
            json.dump(g, f, indent=1)
            f.write("\n")
        return self.name + ".json"


def mlp(name, batch, dims, act):
    g = G(name)
    h = g.inp("x", [batch, dims[0]])
    for i in range(len(dims) - 1):
        w = g.par(f"w{i}", [dims[i], dims[i + 1]])
        b = g.par(f"b{i}", [dims[i + 1]])
        h = g.op("add", [g.op("matmul", [h, w]), b])
        if i < len(dims) - 2:
            h = g.op(act, [h])
    return g.write([g.op("softmax", [h], out="probs")])


def attention(g, x, p, b, s, d, heads, causal, norm):
    if norm == "layernorm":
        ln = g.op("layernorm", [x, g.par(p + "ln1_g", [d]), g.par(p + "ln1_b", [d])], {"eps": 1e-5})
    else:
        ln = g.op("rmsnorm", [x, g.par(p + "rms1_g", [d])], {"eps": 1e-6})
    q = g.op("matmul", [ln, g.par(p + "wq", [d, d])])
    k = g.op("matmul", [ln, g.par(p + "wk", [d, d])])
    v = g.op("matmul", [ln, g.par(p + "wv", [d, d])])
    a = g.op("sdpa", [q, k, v], {"heads": heads, "causal": causal})
    return g.op("add", [g.op("matmul", [a, g.par(p + "wo", [d, d])]), x])


def transformer_block(name, b, s, d, heads, ff):
    g = G(name)
    x = g.inp("x", [b, s, d])
    h = attention(g, x, "", b, s, d, heads, False, "layernorm")
    ln = g.op("layernorm", [h, g.par("ln2_g", [d]), g.par("ln2_b", [d])], {"eps": 1e-5})
    f = g.op("gelu", [g.op("add", [g.op("matmul", [ln, g.par("w1", [d, ff])]), g.par("b1", [ff])])])
    y = g.op("add", [g.op("add", [g.op("matmul", [f, g.par("w2", [ff, d])]), g.par("b2", [d])]), h])
    return g.write([y])


def gpt_stack(name, s, d, heads, layers, vocab):
    g = G(name)
    x = g.inp("x", [1, s, d])
    for l in range(layers):
        p = f"l{l}_"
        x = attention(g, x, p, 1, s, d, heads, True, "rmsnorm")
        n = g.op("rmsnorm", [x, g.par(p + "rms2_g", [d])], {"eps": 1e-6})
        ff = 4 * d
        gate = g.op("silu", [g.op("matmul", [n, g.par(p + "w1", [d, ff])])])
        up = g.op("matmul", [n, g.par(p + "w3", [d, ff])])
        down = g.op("matmul", [g.op("mul", [gate, up]), g.par(p + "w2", [ff, d])])
        x = g.op("add", [down, x])
    n = g.op("rmsnorm", [x, g.par("rmsf_g", [d])], {"eps": 1e-6})
    # tied embedding: logits = n @ emb^T
    logits = g.op("matmul", [n, g.par("emb", [vocab, d])], {"transpose_b": True}, out="logits")
    return g.write([logits])


def convnet(name, n, hw, chans, classes):
    g = G(name)
    x = g.inp("image", [n, chans[0], hw, hw])
    for i in range(len(chans) - 1):
        w = g.par(f"conv{i}_w", [chans[i + 1], chans[i], 3, 3])
        stride = 1 if i == 0 else 2
        c = g.op("conv2d", [x, w], {"stride": stride, "padding": 1})
        x = g.op("relu", [g.op("add", [c, g.par(f"conv{i}_b", [chans[i + 1], 1, 1])])])
        hw = (hw + 2 - 3) // stride + 1
    # per-channel spatial mixing, a scaled tanh, then a classifier over the last axis
    x = g.op("tanh", [g.op("mul", [x, g.par("scale", [chans[-1], 1, 1])])])
    logits = g.op("add", [g.op("matmul", [x, g.par("head_w", [hw, classes])]), g.par("head_b", [classes])])
    return g.write([g.op("softmax", [logits], out="probs")])


def attention_only(name, b, s, d, heads):
    """q/k/v given; exercises transpose + batched matmul + softmax vs sdpa."""
    g = G(name)
    q, k, v = g.inp("q", [b, s, d]), g.inp("k", [b, s, d]), g.inp("v", [b, s, d])
    kt = g.op("transpose", [k])
    sc = g.op("mul", [g.op("matmul", [q, kt]), g.par("scale", [1])])
    p = g.op("softmax", [sc])
    manual = g.op("matmul", [p, v], out="manual")
    fused = g.op("sdpa", [q, k, v], {"heads": heads, "causal": False, "scale": 1.0 / (d ** 0.5)}, out="fused")
    return g.write([manual, fused])


def main():
    graphs = [
        mlp("mlp", 64, [256, 512, 512, 128], "gelu"),
        mlp("mlp_wide", 32, [512, 1024, 256], "silu"),
        transformer_block("transformer_block", 2, 64, 256, 4, 1024),
        convnet("convnet", 2, 32, [3, 16, 32, 64], 10),
        attention_only("attention", 2, 64, 64, 1),
    ]
    for d, h in ((128, 2), (192, 3), (256, 4), (320, 5), (384, 6)):
        graphs.append(gpt_stack(f"gpt_d{d}", 64, d, h, 2, 512))
    manifest = {"format": "kcache-manifest/1", "graphs": graphs,
                "targets": [{"device": "cpu", "target": "native"},
                            {"device": "cpu", "target": "x86-64-v3"}]}
    with open(os.path.join(HERE, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
