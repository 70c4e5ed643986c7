#!/usr/bin/python3
"""Writes two real-size ONNX models with random weights (Debian's python3-onnx
and python3-numpy; run with /usr/bin/python3):

  gpt2_small.onnx  GPT-2-small-shaped decoder: 12 layers, d=768, 12 heads,
                   seq 128, vocab 50257 (opset 17: LayerNormalization, MatMul
                   with batch dims, Split, Reshape/Transpose, Where causal mask,
                   Softmax, Erf-form GELU, Gemm LM head)
  resnet18.onnx    a ResNet-18-shaped conv net on 1x3x224x224 (Conv, BatchNorm,
                   Relu, MaxPool, residual Add, GlobalAveragePool, Gemm)

usage: gen_onnx_models.py OUTDIR [--layers N] [--vocab N]
"""
import argparse
import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

rng = np.random.default_rng(0)


def w(name, shape, scale=0.02):
    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


def ints(name, vals):
    return numpy_helper.from_array(np.array(vals, dtype=np.int64), name)


def gpt2(layers, vocab, d=768, heads=12, seq=128):
    nodes, inits = [], []
    dh = d // heads
    inits += [w("wte", [vocab, d]), w("wpe", [seq, d]), ints("pos", list(range(seq))),
              ints("split3", [d, d, d]), ints("shape_heads", [1, seq, heads, dh]),
              ints("shape_model", [1, seq, d]), ints("shape_2d", [seq, d]),
              numpy_helper.from_array(np.array(1.0 / np.sqrt(dh), np.float32), "att_scale"),
              numpy_helper.from_array(np.array(-1e9, np.float32), "neg_inf"),
              numpy_helper.from_array(np.tril(np.ones((1, 1, seq, seq), bool)), "causal"),
              numpy_helper.from_array(np.array(np.sqrt(0.5), np.float32), "inv_sqrt2"),
              numpy_helper.from_array(np.array(0.5, np.float32), "half"),
              numpy_helper.from_array(np.array(1.0, np.float32), "one")]
    nodes += [helper.make_node("Gather", ["wte", "input_ids"], ["tok"]),
              helper.make_node("Gather", ["wpe", "pos"], ["posemb"]),
              helper.make_node("Add", ["tok", "posemb"], ["h0"])]
    x = "h0"
    for i in range(layers):
        p = "l%d_" % i
        inits += [w(p + "ln1_g", [d], 1.0), w(p + "ln1_b", [d]), w(p + "qkv_w", [d, 3 * d]),
                  w(p + "qkv_b", [3 * d]), w(p + "o_w", [d, d]), w(p + "o_b", [d]),
                  w(p + "ln2_g", [d], 1.0), w(p + "ln2_b", [d]), w(p + "fc_w", [d, 4 * d]),
                  w(p + "fc_b", [4 * d]), w(p + "pr_w", [4 * d, d]), w(p + "pr_b", [d])]
        nodes.append(helper.make_node("LayerNormalization", [x, p + "ln1_g", p + "ln1_b"], [p + "ln1"], axis=-1, epsilon=1e-5))
        nodes.append(helper.make_node("MatMul", [p + "ln1", p + "qkv_w"], [p + "qkv0"]))
        nodes.append(helper.make_node("Add", [p + "qkv0", p + "qkv_b"], [p + "qkv"]))
        nodes.append(helper.make_node("Split", [p + "qkv", "split3"], [p + "q", p + "k", p + "v"], axis=-1))
        for t, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
            nodes.append(helper.make_node("Reshape", [p + t, "shape_heads"], [p + t + "r"]))
            nodes.append(helper.make_node("Transpose", [p + t + "r"], [p + t + "t"], perm=perm))
        nodes.append(helper.make_node("MatMul", [p + "qt", p + "kt"], [p + "s0"]))
        nodes.append(helper.make_node("Mul", [p + "s0", "att_scale"], [p + "s1"]))
        nodes.append(helper.make_node("Where", ["causal", p + "s1", "neg_inf"], [p + "s2"]))
        nodes.append(helper.make_node("Softmax", [p + "s2"], [p + "a"], axis=-1))
        nodes.append(helper.make_node("MatMul", [p + "a", p + "vt"], [p + "y0"]))
        nodes.append(helper.make_node("Transpose", [p + "y0"], [p + "y1"], perm=[0, 2, 1, 3]))
        nodes.append(helper.make_node("Reshape", [p + "y1", "shape_model"], [p + "y2"]))
        nodes.append(helper.make_node("MatMul", [p + "y2", p + "o_w"], [p + "y3"]))
        nodes.append(helper.make_node("Add", [p + "y3", p + "o_b"], [p + "y4"]))
        nodes.append(helper.make_node("Add", [x, p + "y4"], [p + "x1"]))
        nodes.append(helper.make_node("LayerNormalization", [p + "x1", p + "ln2_g", p + "ln2_b"], [p + "ln2"], axis=-1, epsilon=1e-5))
        nodes.append(helper.make_node("MatMul", [p + "ln2", p + "fc_w"], [p + "f0"]))
        nodes.append(helper.make_node("Add", [p + "f0", p + "fc_b"], [p + "f1"]))
        # GELU, the Erf form torch.onnx.export writes
        nodes.append(helper.make_node("Mul", [p + "f1", "inv_sqrt2"], [p + "g0"]))
        nodes.append(helper.make_node("Erf", [p + "g0"], [p + "g1"]))
        nodes.append(helper.make_node("Add", [p + "g1", "one"], [p + "g2"]))
        nodes.append(helper.make_node("Mul", [p + "f1", p + "g2"], [p + "g3"]))
        nodes.append(helper.make_node("Mul", [p + "g3", "half"], [p + "g4"]))
        nodes.append(helper.make_node("MatMul", [p + "g4", p + "pr_w"], [p + "p0"]))
        nodes.append(helper.make_node("Add", [p + "p0", p + "pr_b"], [p + "p1"]))
        nodes.append(helper.make_node("Add", [p + "x1", p + "p1"], [p + "out"]))
        x = p + "out"
    inits += [w("lnf_g", [d], 1.0), w("lnf_b", [d])]
    nodes.append(helper.make_node("LayerNormalization", [x, "lnf_g", "lnf_b"], ["hf"], axis=-1, epsilon=1e-5))
    nodes.append(helper.make_node("Reshape", ["hf", "shape_2d"], ["hf2"]))
    nodes.append(helper.make_node("Gemm", ["hf2", "wte"], ["logits"], transB=1))
    g = helper.make_graph(nodes, "gpt2_small",
                          [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, seq])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [seq, vocab])],
                          inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], producer_name="kcache-examples")


def resnet18(classes=1000):
    nodes, inits = [], []
    count = [0]

    def conv_bn(x, cin, cout, k, s, relu=True):
        i = count[0]
        count[0] += 1
        p = "c%d_" % i
        inits.extend([w(p + "w", [cout, cin, k, k], np.sqrt(2.0 / (cin * k * k))),
                      w(p + "g", [cout], 1.0), w(p + "b", [cout]),
                      w(p + "m", [cout], 0.1),
                      numpy_helper.from_array(np.ones(cout, np.float32), p + "v")])
        nodes.append(helper.make_node("Conv", [x, p + "w"], [p + "c"], kernel_shape=[k, k],
                                      strides=[s, s], pads=[k // 2] * 4))
        nodes.append(helper.make_node("BatchNormalization", [p + "c", p + "g", p + "b", p + "m", p + "v"],
                                      [p + "bn"], epsilon=1e-5))
        if not relu:
            return p + "bn"
        nodes.append(helper.make_node("Relu", [p + "bn"], [p + "r"]))
        return p + "r"

    x = conv_bn("image", 3, 64, 7, 2)
    nodes.append(helper.make_node("MaxPool", [x], ["pool"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]))
    x, cin = "pool", 64
    for stage, cout in enumerate([64, 128, 256, 512]):
        for block in range(2):
            s = 2 if stage > 0 and block == 0 else 1
            h = conv_bn(x, cin, cout, 3, s)
            h = conv_bn(h, cout, cout, 3, 1, relu=False)
            skip = conv_bn(x, cin, cout, 1, s, relu=False) if (s != 1 or cin != cout) else x
            o = "s%db%d" % (stage, block)
            nodes.append(helper.make_node("Add", [h, skip], [o + "_sum"]))
            nodes.append(helper.make_node("Relu", [o + "_sum"], [o]))
            x, cin = o, cout
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["gap"]))
    nodes.append(helper.make_node("Flatten", ["gap"], ["flat"], axis=1))
    inits += [w("fc_w", [classes, 512]), w("fc_b", [classes])]
    nodes.append(helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["logits"], transB=1))
    g = helper.make_graph(nodes, "resnet18",
                          [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, 224, 224])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, classes])],
                          inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], producer_name="kcache-examples")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=50257)
    a = ap.parse_args()
    os.makedirs(a.outdir, exist_ok=True)
    for name, m in (("gpt2_small.onnx", gpt2(a.layers, a.vocab)), ("resnet18.onnx", resnet18())):
        onnx.checker.check_model(m)
        path = os.path.join(a.outdir, name)
        onnx.save(m, path)
        print("%s: %d nodes, %.0f MB" % (path, len(m.graph.node), os.path.getsize(path) / 1e6))


if __name__ == "__main__":
    main()
