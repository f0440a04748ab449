"""A tiny stand-in for a DINOv2/v3 ViT, for the extractor tests."""

import torch
from torch import nn


class FakeViT(nn.Module):
    """The DINOv2/v3 ``get_intermediate_layers`` API (outputs in block order) on a grid
    of ``patch`` x ``patch`` patches, with deterministic weights."""

    def __init__(self, dim=8, patch=4, depth=4):
        super().__init__()
        with torch.random.fork_rng(devices=[]):  # seeded weights, global RNG untouched
            torch.manual_seed(0)
            self.embed = nn.Conv2d(3, dim, patch, stride=patch)
            self.blocks = nn.ModuleList(nn.Linear(dim, dim) for _ in range(depth))
            self.norm = nn.LayerNorm(dim)
            self.cls = nn.Parameter(torch.randn(1, 1, dim))

    def get_intermediate_layers(self, x, n, reshape, return_class_token, norm):
        t = self.embed(x)
        B, C, h, w = t.shape
        tok = torch.cat([self.cls.expand(B, -1, -1), t.flatten(2).transpose(1, 2)], 1)
        outs = []
        for i, blk in enumerate(self.blocks):
            tok = tok + torch.tanh(blk(tok))
            if i in n:
                o = self.norm(tok) if norm else tok
                patches = o[:, 1:].transpose(1, 2).reshape(B, C, h, w) if reshape else o[:, 1:]
                outs.append((patches, o[:, 0]) if return_class_token else patches)
        return tuple(outs)
