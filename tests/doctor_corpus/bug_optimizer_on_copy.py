"""Builds the optimizer over a deep copy of the model, then trains the original."""

# expect: stale_optimizer
import copy

import torch


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    shadow = copy.deepcopy(model)
    opt = torch.optim.Adam(shadow.parameters(), lr=1e-2)
    for _ in range(epochs):
        model.train()
        for x, y in train_loader:
            opt.zero_grad()
            loss_fn(model(x.to(device)), y.to(device)).backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            for x, _ in val_loader:
                model(x.to(device))
