"""Batches come through a generator that moves them to the device; metrics are a generator too."""
# expect: none

import torch


def on_device(loader, device):
    for batch in loader:
        yield tuple(t.to(device, non_blocking=True) for t in batch)


def accuracy(model, loader, device):
    hits = ((model(x).argmax(1) == y).float().mean().item() for x, y in on_device(loader, device))
    return sum(hits) / len(loader)


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    scores = []
    for _ in range(epochs):
        model.train(True)
        for x, y in on_device(train_loader, device):
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()
        model.train(False)
        with torch.no_grad():
            scores.append(accuracy(model, val_loader, device))
    return scores
