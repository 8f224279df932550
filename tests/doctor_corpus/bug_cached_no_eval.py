"""Caches the batches on the device; validates under `no_grad` but in train mode."""
# expect: no_eval_mode

import torch


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    train_batches = [(x.to(device), y.to(device)) for x, y in train_loader]
    val_batches = [(x.to(device), y.to(device)) for x, y in val_loader]
    history = []
    for _ in range(epochs):
        for x, y in train_batches:
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()
        with torch.no_grad():
            history.append(sum(loss_fn(model(x), y).item() for x, y in val_batches))
    return history
