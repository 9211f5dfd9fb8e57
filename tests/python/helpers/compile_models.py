"""Small models the compile tests share."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    """Linear, tanh-GELU, layer norm * sigmoid, linear, log-softmax: (N, 32) -> (N, 16)."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(32, 64)
        self.norm = nn.LayerNorm(64)
        self.fc2 = nn.Linear(64, 16)

    def forward(self, x):
        h = F.gelu(self.fc1(x), approximate="tanh")
        h = self.norm(h) * torch.sigmoid(h)
        return F.log_softmax(self.fc2(h), dim=-1)
