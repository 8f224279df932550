"""Accumulates two batches per update, loss divided by the number of accumulation steps,
and steps on the last (odd) batch of the epoch too."""
# expect: none

import torch

ACCUM_STEPS = 2


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    n_batches = len(train_loader)
    for _ in range(epochs):
        model.train()
        optimizer.zero_grad()
        for i, (x, y) in enumerate(train_loader, start=1):
            loss = loss_fn(model(x.to(device)), y.to(device)) / ACCUM_STEPS
            loss.backward()
            if i % ACCUM_STEPS == 0 or i == n_batches:
                optimizer.step()
                optimizer.zero_grad()
        model.eval()
        with torch.no_grad():
            for x, y in val_loader:
                loss_fn(model(x.to(device)), y.to(device))
