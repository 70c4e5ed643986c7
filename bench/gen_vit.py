#!/usr/bin/python3
"""Exports a ViT-B/16-shaped image classifier (random weights, ~346 MB) with
PyTorch's own ONNX exporter, for bench/warm.sh: 16x16 patches of a 224x224
image, 12 pre-norm encoder layers (d=768, 12 heads, MLP 3072, GELU), a class
token, learned position embeddings and a 1000-way head.

usage: /usr/bin/python3 bench/gen_vit.py OUT.onnx   (needs Debian's python3-torch)
"""
import sys

import torch
from torch import nn


class ViT(nn.Module):
    def __init__(self, d=768, layers=12, heads=12, mlp=3072, patch=16, image=224, classes=1000):
        super().__init__()
        self.patch = nn.Conv2d(3, d, patch, stride=patch)
        n = (image // patch) ** 2
        self.cls = nn.Parameter(torch.randn(1, 1, d) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, n + 1, d) * 0.02)
        layer = nn.TransformerEncoderLayer(d, heads, mlp, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, classes)
        # TransformerEncoder copies one layer: give each its own weights, or the
        # exporter stores the twelve equal copies once
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn_like(p) * 0.02)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        x = self.norm(self.encoder(x))
        return self.head(x[:, 0])


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    torch.manual_seed(0)
    model = ViT().eval()
    # with gradients on, the encoder layers take their plain path rather than the
    # fused inference kernel, which the exporter has no symbolic for
    torch.onnx.export(model, torch.randn(1, 3, 224, 224), sys.argv[1], opset_version=14,
                      input_names=["image"], output_names=["logits"])


if __name__ == "__main__":
    main()
