"""Accumulates by summing three micro-batch losses (each weighted by its share of the examples)
and calling backward once per group."""
# expect: none

import torch


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    group = []
    for _ in range(epochs):
        model.train()
        batches = list(train_loader)
        for start in range(0, len(batches), 3):
            group = batches[start : start + 3]
            n = sum(len(y) for _, y in group)
            optimizer.zero_grad()
            total = sum(loss_fn(model(x.to(device)), y.to(device)) * len(y) / n for x, y in group)
            total.backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            for x, y in val_loader:
                model(x.to(device))
    return len(group)
