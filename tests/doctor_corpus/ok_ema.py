"""Keeps an exponential moving average of the weights in a deep copy and validates with it."""

# expect: none
import copy

import torch


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    ema = copy.deepcopy(model).eval()
    for p in ema.parameters():
        p.requires_grad_(False)
    for _ in range(epochs):
        model.train()
        for x, y in train_loader:
            optimizer.zero_grad()
            loss_fn(model(x.to(device)), y.to(device)).backward()
            optimizer.step()
            with torch.no_grad():
                for e, p in zip(ema.parameters(), model.parameters()):
                    e.mul_(0.9).add_(p, alpha=0.1)
        with torch.no_grad():
            acc = sum(
                (ema(x.to(device)).argmax(1) == y.to(device)).sum().item() for x, y in val_loader
            )
    return acc
