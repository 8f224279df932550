"""Calls `model.eval()` once at the start "for reproducible results", so Dropout never trains."""
# expect: train_mode_not_restored

import torch


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device).eval()
    for _ in range(epochs):
        for x, y in train_loader:
            optimizer.zero_grad()
            loss_fn(model(x.to(device)), y.to(device)).backward()
            optimizer.step()
        with torch.no_grad():
            for x, y in val_loader:
                model(x.to(device))
